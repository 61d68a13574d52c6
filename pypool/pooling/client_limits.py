"""max_db_client_connections and max_user_client_connections: clients per database and per
user, counted from the login attempt on, as PgBouncer counts them.

A client counts against its database and its user from the moment its StartupMessage names
them (before the password: a flood of logins is what the caps are for) until it leaves. The
cap is the [databases] or [users] value, else the [pgbouncer] one; 0 is no cap. A client over
a cap is refused with PgBouncer's text, `client connections exceeded (<key>)`. The console
stays reachable for admin_users (and for the pooler's own OS user over the unix socket), as
PgBouncer exempts them: that is when an operator needs it.

SHOW DATABASES (current_client_connections, max_client_connections) and SHOW USERS
(current_client_connections, max_user_client_connections) read the counts and caps here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..protocol.errors import PoolerError

if TYPE_CHECKING:
    from ..settings import Settings

ADMIN_DATABASES = ("pgbouncer", "pypool")


class CountedClient(Protocol):
    @property
    def database(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def own_user(self) -> bool: ...


class ClientCounts:
    """Who counts against which database and user, and the admission check."""

    def __init__(self) -> None:
        self._counted: dict[object, tuple[str, str]] = {}  # client -> (database, user)
        self.per_database: dict[str, int] = {}
        self.per_user: dict[str, int] = {}

    def admit(self, settings: Settings, client: CountedClient) -> None:
        """Count `client` in; raise PoolerError (it stays counted until `forget`, as in
        PgBouncer, whose disconnect uncounts it) when it is over a cap."""
        database, user = client.database, client.user
        if client not in self._counted:
            self._counted[client] = (database, user)
            self.per_database[database] = self.per_database.get(database, 0) + 1
            self.per_user[user] = self.per_user.get(user, 0) + 1
        exempt = database in ADMIN_DATABASES and (
            client.own_user or user in settings.pooler.admin_users)
        if exempt:
            return
        cap = settings.database_client_cap(database)
        if cap and self.per_database[database] > cap:
            raise PoolerError("client connections exceeded (max_db_client_connections)")
        cap = settings.user_client_cap(user)
        if cap and self.per_user[user] > cap:
            raise PoolerError("client connections exceeded (max_user_client_connections)")

    def forget(self, client: object) -> None:
        counted = self._counted.pop(client, None)
        if counted is None:
            return
        database, user = counted
        self.per_database[database] -= 1
        self.per_user[user] -= 1
        if not self.per_database[database]:
            del self.per_database[database]
        if not self.per_user[user]:
            del self.per_user[user]
