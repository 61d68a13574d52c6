"""auth_query: fetch a user's password hash from PostgreSQL, as auth_user.

Used when a client's user is not in the auth_file and `auth_user` is set (globally or on
the database entry). It runs on its own short-lived connection through psycopg; the
result is the secret to check the client against (usually a SCRAM verifier).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..auth.server_credentials import ServerCredentials
    from ..settings import DatabaseEntry


class AuthQueryLoginFailed(Exception):
    """The server refused auth_user's login (its severity and message, as it sent them)."""

    def __init__(self, severity: str, message: str) -> None:
        super().__init__(message)
        self.severity = severity
        self.message = message


class AuthQueryFailed(Exception):
    """auth_query itself failed on the server (a bad query, a missing table): the server's
    message, for the log. The client is told "bouncer config error", as PgBouncer tells it."""


async def run_auth_query(
    entry: DatabaseEntry, auth_user: str, creds: ServerCredentials, sql: str, user: str
) -> tuple[bool, str | None]:
    """(whether the query found the user, its secret: None when there is none to check a
    password against, e.g. a NULL rolpassword). A found user is one the pooler knows (trust
    lets it in) even without a password."""
    import psycopg

    # auth_user logs in with its plaintext password from the auth_file, or with none at all
    # (a server that trusts it, as PgBouncer allows: an auth_user need not be in the file).
    query = sql.replace("%", "%%").replace("$1", "%s")
    try:
        conn = await psycopg.AsyncConnection.connect(
            host=entry.host, port=entry.port, dbname=entry.server_dbname, user=auth_user,
            password=creds.password or "", autocommit=True, connect_timeout=10,
        )
    except psycopg.OperationalError as exc:
        # libpq puts the server's refusal in the text ("... failed: FATAL:  <message>").
        said = re.search(r"\b(FATAL|ERROR|PANIC):\s+(.+)", str(exc))
        if said:  # the server said why: as a failed server login
            raise AuthQueryLoginFailed(said.group(1), said.group(2).strip()) from None
        raise
    async with conn:
        try:
            cur = await conn.execute(query, (user,))  # type: ignore[arg-type]
            row = await cur.fetchone()
        except psycopg.Error as bad:
            raise AuthQueryFailed(bad.diag.message_primary or str(bad)) from None
    if row is None:
        return False, None
    return True, None if row[1] is None else str(row[1])
