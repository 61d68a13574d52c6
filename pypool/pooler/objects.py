"""The Pooler: the running pooler's objects, and the calls the other layers make into it.

The Pooler owns every connection object and the bookkeeping around them: the pools by
(database, user) and the limits each is built with, the servers it opens (per database and
per user, under max_db_connections and max_user_connections), the clients from their TCP
connection to their close, the secrets and cancel keys, and the servers with writes
deferred to the end of the loop's round. It decides nothing about who gets which server:
the sans-IO Pool does, and linking.py carries it out.

The client and server Protocols (net/) call in here at their turning points, through the
narrow port they see it as (net/port.py's PoolerPort, which this class implements): a
client authenticated, a client needs a server, a transaction ended, a server logged in or
closed. The work belongs to other concepts (client_logins.py, teardown.py, linking.py,
transactions.py, server_logins.py, cancel.py, janitor.py, lifecycle.py); the methods here
only hand over, so those callers need know nothing of the split.

Decided here: only the limits a pool is built with and the credentials a server logs in
with. A method that grows more belongs in the module of its concept, not here.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Coroutine
from typing import Any

from ..auth import server_credentials
from ..auth.server_credentials import ServerCredentials
from ..net import pipeline
from ..net.client import ClientConnection
from ..net.hooks import (
    OpenConsole,
    OpenTrace,
    OpenTransactionLog,
    ServeMetrics,
    TransactionLog,
    WireTrace,
)
from ..net.server import ServerConnection
from ..net.tls import Tls
from ..net.unix_socket import UnixSocket
from ..pooling.client_limits import ClientCounts
from ..pooling.peer_pool import PeerPool
from ..pooling.pool import Pool, PoolLimits
from ..pooling.prepared import Registry
from ..pooling.stats import StatsPeriods
from ..protocol import cancel_key
from ..protocol.errors import PoolerError
from ..settings import DatabaseEntry, Settings
from . import (
    cancel,
    client_logins,
    hba_login,
    lifecycle,
    linking,
    replication,
    research,
    server_logins,
    teardown,
    tracing,
    transactions,
)
from .host_lists import HostChooser
from .takeover import Takeover

log = logging.getLogger("pypool")


class Pooler:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # The keys every transaction reads, copied from `settings` by use_settings (a read
        # of the frozen dataclasses costs two dictionary lookups, these one field access).
        self.check_query = ""
        self.check_delay = 0.0
        self.pipeline_depth = 0
        self.server_lifetime = 0.0
        self.reset_query_always = ""  # server_reset_query, if server_reset_query_always
        self.use_settings(settings)
        self.loop = asyncio.get_running_loop()
        # Not loop.time: uvloop's is cached per iteration at millisecond resolution, which
        # would round every transaction, query and wait time (SHOW STATS, histograms) to ms.
        self.now = time.monotonic
        self.start_time = time.time()
        self.pools: dict[tuple[str, str], Pool] = {}
        self.clients: set[ClientConnection] = set()
        self.login_clients: set[ClientConnection] = set()
        self.cancel_keys: dict[tuple[int, int], ClientConnection] = {}
        # Cancels on their way to [peers] (peers.py); with `workers`, this one's number, how
        # many there are and their parent (set by cli.serve before start).
        self.peer_pools: dict[int, PeerPool] = {}
        self.worker_index = cancel_key.NO_WORKER
        self.worker_count = 0
        self.worker_parent = 0
        self.servers_per_db: dict[str, int] = {}
        self.servers_per_user: dict[str, int] = {}
        # The auth_file's secrets by user, and the hba rules (client_logins.load_auth).
        self.auth_secrets: dict[str, str] = {}
        self.hba = hba_login.HbaConfig()
        self.auth_query_secrets: dict[str, str] = {}
        self.scram_client_keys: dict[str, bytes] = {}
        # Prepared statements by Parse body, shared by all pools (pooling/prepared/).
        self.statement_registry = Registry()
        self.listeners: list[asyncio.AbstractServer] = []  # TCP
        # The unix socket's files and listening socket (claimed by lifecycle.start, or by the
        # parent of `workers`), and the server accepting on it.
        self.unix_socket: UnixSocket | None = None
        self.unix_listener: asyncio.AbstractServer | None = None
        self.shutting_down = ""  # "", "SIGINT" (drain transactions) or "SIGTERM" (drain clients)
        # Online restart (pooler/takeover.py): the socket a new process asks on, whether one
        # is taking over now, and, in the new process, the sockets it was passed.
        self.takeover_socket: socket.socket | None = None
        self.handing_over = False
        self.taken: Takeover | None = None
        self.stopped = self.loop.create_future()
        self.janitor_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Servers with writes deferred to the end of this round (net/deferred_writes.py).
        self.to_flush: list[ServerConnection] = []
        # The operator's switches (admin console, SIGUSR1/2): PAUSE of everything or of some
        # databases, DISABLE; databases gone from the config whose clients are still here.
        self.paused_all = False
        self.suspended = False  # SUSPEND: paused_all too, shown as suspended (SHOW STATE)
        self.client_counts = ClientCounts()  # max_db/user_client_connections
        self.console_queries = 0  # the console's own xact_count and query_count (SHOW STATS)
        self.console_logins = 0  # and its client_login_count
        self.hosts = HostChooser()  # host=a,b lists and load_balance_hosts
        self.paused_dbs: set[str] = set()
        self.disabled_dbs: set[str] = set()
        self.retired: dict[str, DatabaseEntry] = {}
        self.stats_periods = StatsPeriods(self.now())  # SHOW STATS averages, the stats line
        self.metrics_servers: list[asyncio.AbstractServer] = []
        # The console and the metrics endpoint, plugged in at start-up (cli.build_pooler):
        # net/ never imports them. None: no console, no metrics (net/hooks.py).
        self.open_console: OpenConsole | None = None
        self.serve_metrics: ServeMetrics | None = None
        # The TLS contexts in force (net/tls.py), rebuilt by apply_settings.
        self.tls = Tls(settings.pooler)
        # Research (pooler/research.py): the pools' policies, and the transaction log, opened
        # through the hook cli.py sets (None: off).
        self.policy_factories: research.Factories = research.factories(settings.pooler)
        self.open_txlog: OpenTransactionLog | None = None
        self.txlog: TransactionLog | None = None
        # The protocol trace (pooler/tracing.py), made through the hook cli.py sets once it is
        # first wanted; `trace_all` is it with `trace = on`, else None.
        self.open_trace: OpenTrace | None = None
        self.wire_trace: WireTrace | None = None
        self.trace_all: WireTrace | None = None
        # Replication clients waiting for their own server, and the joined pairs
        # (pooler/replication.py).
        self.replication = replication.Replication()
        self.load_auth()

    def load_auth(self) -> None:
        """(Re)read the auth_file and the hba file (pooler/client_logins.py)."""
        client_logins.load_auth(self)

    # --- pools and servers ----------------------------------------------------------------

    def limits_for(self, entry: DatabaseEntry, user: str) -> PoolLimits:
        cfg = self.settings.pooler
        user_entry = self.settings.users.get(user)

        def pick(*values: float | str | None) -> float | str:
            return next(v for v in values if v is not None)

        # As PgBouncer: a [users] size wins over the [databases] one, which wins over the
        # [pgbouncer] default.
        return PoolLimits(
            pool_size=int(pick(user_entry.pool_size if user_entry else None, entry.pool_size,
                               cfg.default_pool_size)),
            min_pool_size=int(pick(entry.min_pool_size, cfg.min_pool_size)),
            reserve_pool_size=int(pick(user_entry.reserve_pool_size if user_entry else None,
                                       entry.reserve_pool_size, cfg.reserve_pool_size)),
            reserve_pool_timeout=cfg.reserve_pool_timeout,
            pool_mode=str(pick(user_entry.pool_mode if user_entry else None, entry.pool_mode,
                               cfg.pool_mode)),
            server_lifetime=(cfg.server_lifetime if entry.server_lifetime is None
                             else entry.server_lifetime),
            query_wait_timeout=float(pick(
                user_entry.query_wait_timeout if user_entry else None,
                entry.query_wait_timeout, cfg.query_wait_timeout)),
            session_state=str(pick(entry.session_state, cfg.session_state)),
        )

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

    def credentials_for(self, entry: DatabaseEntry, user: str) -> ServerCredentials:
        if entry.password:
            return ServerCredentials(user, password=entry.password)
        secret = self.auth_secrets.get(user) or self.auth_query_secrets.get(user)
        return server_credentials.from_secret(user, secret, self.scram_client_keys.get(user))

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
                    startup: dict[str, str]) -> ServerConnection:
        return server_logins.open_server(self, pool, entry, startup)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def server_logged_in(self, server: ServerConnection) -> None:
        server_logins.server_logged_in(self, server)

    def server_closed(self, server: ServerConnection, reason: str) -> None:
        """Forget a server that is gone; its client, if it had one, gets an error
        (pooler/teardown.py)."""
        teardown.server_closed(self, server, reason)

    def close_server(self, server: ServerConnection, reason: str) -> None:
        """Close a server on purpose (pooler/teardown.py)."""
        teardown.close_server(self, server, reason)

    # --- clients --------------------------------------------------------------------------

    def client_connected(self, client: ClientConnection) -> None:
        client_logins.client_connected(self, client)

    def begin_authentication(self, client: ClientConnection) -> None:
        """The startup packet is in: admit the client and find its secret
        (pooler/client_logins.py)."""
        client_logins.begin_authentication(self, client)

    def client_authenticated(self, client: ClientConnection, scram_key: bytes | None) -> None:
        """A cancel key, then the console or the pool (pooler/client_logins.py)."""
        client_logins.client_authenticated(self, client, scram_key)

    def enter_pool(self, client: ClientConnection) -> Pool:
        """The client joins the pool of its database and user (pooler/client_logins.py)."""
        return client_logins.enter_pool(self, client)

    def login_failing(self, pool: Pool) -> PoolerError | None:
        return server_logins.login_failing(self, pool)

    def client_closed(self, client: ClientConnection, reason: str) -> None:
        """Forget a client that is gone; its server goes back or closes
        (pooler/teardown.py)."""
        teardown.client_closed(self, client, reason)

    # --- pipelining ----------------------------------------------------------------------

    def pipeline(self, server: ServerConnection) -> None:
        """The linked client has sent a whole transaction: if it ends at its Sync, queue
        waiting clients behind it (net/pipeline.py)."""
        if pipeline.worth_extending(server):
            pipeline.extend(self, server)

    # --- where the Protocols, the console and the start-up call in -----------------------
    # The work is done in the modules named; these keep the calls the other layers make.

    def request_server(self, client: ClientConnection) -> None:
        """The client has sent something that needs a server (linking.py)."""
        linking.request_server(self, client)

    def ready_for_query(self, client: ClientConnection, status: int) -> None:
        """The linked server forwarded a ReadyForQuery to `client`: release, keep or close
        the server (transactions.py)."""
        transactions.ready_for_query(self, client, status)

    def session_changed(self, client: ClientConnection) -> None:
        """The client sent statements that change session state (transactions.py)."""
        transactions.session_changed(self, client)

    def release(self, client: ClientConnection, now: float = 0.0) -> None:
        """The client's transaction ended and nothing is owed: its server goes back
        (linking.py)."""
        linking.release(self, client, now)

    def parameters_applied(self, server: ServerConnection, client: ClientConnection) -> None:
        linking.parameters_applied(self, server, client)

    def check_failed(self, server: ServerConnection, client: ClientConnection | None,
                     why: str) -> None:
        linking.check_failed(self, server, client, why)

    def parameters_failed(self, server: ServerConnection, client: ClientConnection,
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

    def use_settings(self, settings: Settings) -> None:
        """Make `settings` the pooler's (at start, and by lifecycle.apply_settings)."""
        self.settings = settings
        cfg = settings.pooler
        self.check_query = cfg.server_check_query
        self.check_delay = float(cfg.server_check_delay)
        self.pipeline_depth = int(cfg.pipeline_depth)
        self.server_lifetime = float(cfg.server_lifetime)
        self.reset_query_always = (cfg.server_reset_query if cfg.server_reset_query_always
                                   else "")

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

