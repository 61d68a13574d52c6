"""auth_dbname: which [databases] entry auth_query runs against, as PgBouncer picks it.

The client's database entry's own `auth_dbname`, else the [pgbouncer] one, else the
client's database itself (for the console, which cannot run a query: the [pgbouncer] one).
The entry named (or the `*` fallback) gives the connection auth_query uses; auth_user and
auth_query stay the client database's (else the global ones). A name with no entry, a
disabled one, or the console's reserved `pgbouncer` refuses the login with PgBouncer's
texts, and the reason is logged for the operator.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

from ..protocol.errors import PoolerError

if TYPE_CHECKING:
    from ..settings import DatabaseEntry, Settings

log = logging.getLogger("pypool")

RESERVED = ("pgbouncer", "pypool")


def resolve(settings: Settings, disabled: Collection[str], entry: DatabaseEntry,
            client: object) -> DatabaseEntry:
    """The entry auth_query connects with for a client of `entry` (`client` names it in
    the log)."""
    name = entry.auth_dbname or settings.pooler.auth_dbname
    if not name:
        return entry
    if name in RESERVED:
        log.error('%r: cannot use the reserved "%s" database as an auth_dbname', client, name)
        raise PoolerError("bouncer config error")
    auth_entry = settings.database(name)
    if auth_entry is None:
        log.error('%r: authentication database "%s" is not configured.', client, name)
        raise PoolerError("bouncer config error")
    if name in disabled:
        raise PoolerError(f'authentication database "{name}" is disabled')
    return auth_entry


def for_console(settings: Settings, disabled: Collection[str], client: object) -> DatabaseEntry:
    """The entry auth_query runs on for a console login by a user not in the auth_file: the
    [pgbouncer] auth_dbname's (the console itself cannot run a query)."""
    name = settings.pooler.auth_dbname
    if not name:
        log.error('%r: cannot use the reserved "pgbouncer" database as an auth_dbname', client)
        raise PoolerError("bouncer config error")
    from ..settings import DatabaseEntry

    return resolve(settings, disabled, DatabaseEntry(name="pgbouncer"), client)
