"""auth_query: fetch a user's password hash from PostgreSQL, as auth_user.

Used when a client's user is not in the auth_file and `auth_user` is set (globally or on
the database entry). It runs on its own short-lived connection through psycopg; the
result is the secret to check the client against (usually a SCRAM verifier).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..pooler import ServerCredentials
    from ..settings import DatabaseEntry


async def run_auth_query(
    entry: DatabaseEntry, auth_user: str, creds: ServerCredentials, sql: str, user: str
) -> str | None:
    import psycopg

    if creds.password is None:
        raise RuntimeError(f"auth_user {auth_user!r} needs a plaintext password")
    query = sql.replace("%", "%%").replace("$1", "%s")
    async with await psycopg.AsyncConnection.connect(
        host=entry.host, port=entry.port, dbname=entry.server_dbname, user=auth_user,
        password=creds.password, autocommit=True, connect_timeout=10,
    ) as conn:
        cur = await conn.execute(query, (user,))  # type: ignore[arg-type]
        row = await cur.fetchone()
    if row is None or row[1] is None:
        return None
    return str(row[1])
