"""The Pooler: the running pooler's objects, and the calls the other layers make into it.

The Pooler owns every connection object and the bookkeeping around them: the pools by
(database, user) and the limits each is built with, the servers it opens (per database and
per user, under max_db_connections and max_user_connections), the clients from their TCP
connection to their close, the secrets and cancel keys, and the servers with writes
deferred to the end of the loop's round. It decides nothing about who gets which server:
the sans-IO Pool does, and linking.py carries it out.

The client and server Protocols (net/) call in here at their turning points, through the
narrow port they see it as (net/records.py's PoolerPort, which this class implements): a
client authenticated, a client needs a server, a transaction ended, a server logged in or
closed. The work belongs to other concepts (client_logins.py, teardown.py, linking.py,
transactions.py, server_logins.py, cancel.py, janitor.py, lifecycle.py); the methods here
only hand over, so those callers need know nothing of the split.

Its fields, and the limits and credentials they alone decide, are said in record.py: the
parts above take the pooler as that PoolerRecord, so that none of them imports this module.
A method that grows more than a hand-over belongs in the module of its concept, not here.
"""

from __future__ import annotations

import logging

from ..net import pipeline
from ..net.records import ClientRecord, ServerRecord
from ..pooling.pool import Pool
from ..protocol.errors import PoolerError
from ..settings import DatabaseEntry, Settings
from . import (
    cancel,
    client_logins,
    lifecycle,
    linking,
    research,
    server_logins,
    teardown,
    tracing,
    transactions,
)
from .record import PoolerRecord

log = logging.getLogger("pypool")


class Pooler(PoolerRecord):
    """The running pooler: its fields (record.py) and the calls the other layers make."""

    def __init__(self, settings: Settings) -> None:
        # Its fields, said once (pooler/record.py).
        PoolerRecord.__init__(self, settings, research.factories(settings.pooler))
        self.load_auth()

    def load_auth(self) -> None:
        """(Re)read the auth_file and the hba file (pooler/client_logins.py)."""
        client_logins.load_auth(self)

    # --- pools and servers ----------------------------------------------------------------

    def pool_for(self, database: str, user: str) -> Pool | None:
        entry = self.settings.database(database)
        if entry is None:
            return None
        user = entry.user or user
        key = (database, user)
        pool = self.pools.get(key)
        if pool is None:
            if database not in self.settings.databases and not any(
                    p.database == database for p in self.pools.values()):
                log.info("registered new auto-database: db=%s", database)  # from `*`
            queue_policy, server_policy = research.new_policies(self)
            pool = Pool(database, user, self.limits_for(entry, user), queue_policy,
                        server_policy)
            pool.paused = self.paused_all or database in self.paused_dbs
            pool.disabled = database in self.disabled_dbs
            self.pools[key] = pool
            self.launch_servers(pool)
        return pool

    def launch_servers(self, pool: Pool) -> None:
        """Open the servers `pool` needs now (pooler/server_logins.py)."""
        server_logins.launch_servers(self, pool)

    def evict_idle(self, pool: Pool, same_db: bool, same_user: bool) -> bool:
        return server_logins.evict_idle(self, pool, same_db, same_user)

    def cap_room(self, pool: Pool, entry: DatabaseEntry) -> tuple[int | None, int | None]:
        return server_logins.cap_room(self, pool, entry)

    def entry_startup(self, entry: DatabaseEntry) -> dict[str, str]:
        return server_logins.entry_startup(self, entry)

    def open_server(self, pool: Pool, entry: DatabaseEntry,
                    startup: dict[str, str]) -> ServerRecord:
        return server_logins.open_server(self, pool, entry, startup)

    def server_logged_in(self, server: ServerRecord) -> None:
        server_logins.server_logged_in(self, server)

    def server_closed(self, server: ServerRecord, reason: str) -> None:
        """Forget a server that is gone; its client, if it had one, gets an error
        (pooler/teardown.py)."""
        teardown.server_closed(self, server, reason)

    def close_server(self, server: ServerRecord, reason: str) -> None:
        """Close a server on purpose (pooler/teardown.py)."""
        teardown.close_server(self, server, reason)

    # --- clients --------------------------------------------------------------------------

    def client_connected(self, client: ClientRecord) -> None:
        client_logins.client_connected(self, client)

    def begin_authentication(self, client: ClientRecord) -> None:
        """The startup packet is in: admit the client and find its secret
        (pooler/client_logins.py)."""
        client_logins.begin_authentication(self, client)

    def client_authenticated(self, client: ClientRecord, scram_key: bytes | None) -> None:
        """A cancel key, then the console or the pool (pooler/client_logins.py)."""
        client_logins.client_authenticated(self, client, scram_key)

    def enter_pool(self, client: ClientRecord) -> Pool:
        """The client joins the pool of its database and user (pooler/client_logins.py)."""
        return client_logins.enter_pool(self, client)

    def login_failing(self, pool: Pool) -> PoolerError | None:
        return server_logins.login_failing(self, pool)

    def client_closed(self, client: ClientRecord, reason: str) -> None:
        """Forget a client that is gone; its server goes back or closes
        (pooler/teardown.py)."""
        teardown.client_closed(self, client, reason)

    # --- pipelining ----------------------------------------------------------------------

    def pipeline(self, server: ServerRecord) -> None:
        """The linked client has sent a whole transaction: if it ends at its Sync, queue
        waiting clients behind it (net/pipeline.py)."""
        if pipeline.worth_extending(server):
            pipeline.extend(self, server)

    # --- where the Protocols, the console and the start-up call in -----------------------
    # The work is done in the modules named; these keep the calls the other layers make.

    def request_server(self, client: ClientRecord, now: float = 0.0) -> None:
        """The client has sent something that needs a server (linking.py)."""
        linking.request_server(self, client, now)

    def ready_for_query(self, client: ClientRecord, status: int) -> None:
        """The linked server forwarded a ReadyForQuery to `client`: release, keep or close
        the server (transactions.py)."""
        transactions.ready_for_query(self, client, status)

    def message_sent(self, client: ClientRecord) -> None:
        """The rest of a message whose start was on the linked server has gone to it: a
        ReadyForQuery that came meanwhile is judged now (transactions.py)."""
        transactions.message_sent(self, client)

    def session_changed(self, client: ClientRecord) -> None:
        """The client sent statements that change session state (transactions.py)."""
        transactions.session_changed(self, client)

    def release(self, client: ClientRecord, now: float = 0.0) -> None:
        """The client's transaction ended and nothing is owed: its server goes back
        (linking.py)."""
        linking.release(self, client, now)

    def parameters_applied(self, server: ServerRecord, client: ClientRecord) -> None:
        linking.parameters_applied(self, server, client)

    def check_failed(self, server: ServerRecord, client: ClientRecord | None,
                     why: str) -> None:
        linking.check_failed(self, server, client, why)

    def parameters_failed(self, server: ServerRecord, client: ClientRecord,
                          fields: dict[str, str]) -> None:
        linking.parameters_failed(self, server, client, fields)

    def forward_cancel(self, pid: int, secret: int) -> None:
        """A CancelRequest with a pooler-issued key (cancel.py)."""
        cancel.forward_cancel(self, pid, secret)

    def cancel_here(self, pid: int, secret: int) -> None:
        """A CancelRequest with a key this process issued, passed on by a sibling worker or
        by the process taking over (cancel.py)."""
        cancel.cancel_here(self, pid, secret)

    async def start(self) -> None:
        await lifecycle.start(self)

    def install_signals(self) -> None:
        lifecycle.install_signals(self)

    def reload(self) -> bool:
        """Re-read the ini and the auth_file; keep the old config if the new one is bad."""
        return lifecycle.reread(self)

    def apply_settings(self, new: Settings) -> None:
        lifecycle.apply_settings(self, new)

    @property
    def tls_failure(self) -> str | None:
        """Why the last settings applied could not set TLS up (net/tls.py), or None."""
        return self.tls.failure

    def trace_client(self, target: str, on: bool) -> int:
        """The console's TRACE (pooler/tracing.py): clients traced now."""
        return tracing.switch(self, target, on)

    def pause_all(self, paused: bool) -> None:
        lifecycle.pause_all(self, paused)

    def set_paused(self, pool: Pool, paused: bool) -> None:
        lifecycle.set_paused(self, pool, paused)

    def tag_dirty(self, pool: Pool, reason: str) -> None:
        lifecycle.tag_dirty(self, pool, reason)

    def shutdown(self, how: str) -> None:
        lifecycle.shutdown(self, how)

    def exit_now(self) -> None:
        """Close everything and stop (lifecycle.py)."""
        lifecycle.exit_now(self)

