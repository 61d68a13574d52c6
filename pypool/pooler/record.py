"""What the running pooler holds: the Pooler's fields, and the calls made into it.

As net/records.py says a client's fields once for net/client.py, PoolerRecord says the
running pooler's once: the pools by (database, user), the servers per database and user,
the clients from their TCP connection to their close, the secrets and cancel keys, the
switches, the hooks plugged in at start-up. It decides only what follows from them alone:
the limits a pool is built with and the credentials a server logs in with. Like net/
itself, pooler/ names the connections by their records (net/records.py's ClientRecord and
ServerRecord), which declare the calls made on them.

pooler/'s parts (client_logins.py, linking.py, transactions.py, teardown.py,
server_logins.py, cancel.py, janitor.py, lifecycle.py, ...) take the pooler as a
PoolerRecord (imported as `Pooler`), not as objects.py's Pooler: objects.py imports every
one of them to hand over to it, so they must not import objects.py, not even to type a
parameter. The calls a part makes on the pooler (`pooler.launch_servers`,
`pooler.close_server`, ...) and those net/ makes (net/records.py's PoolerPort, for the parts
hand the pooler to connections) are declared at the end of this class; objects.py's Pooler
carries each out by handing over to the part that owns it, and tests/pooler/test_record.py
keeps the list exactly those calls. It declares PoolerPort (a mypyc trait) among its bases,
so the calls net/ makes are direct too. Compiled, they are direct calls through the class's
method table, as on the Pooler itself.

Never here: an import of a part of pooler/ that takes a pooler, or work beyond the fields.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..auth import server_credentials
from ..auth.server_credentials import ServerCredentials
from ..net.records import PoolerPort
from ..net.tls import Tls
from ..pooling.client_limits import ClientCounts
from ..pooling.pool import PoolLimits
from ..pooling.prepared import Registry
from ..pooling.stats import StatsPeriods
from ..protocol import cancel_key
from .hba_login import HbaConfig
from .host_lists import HostChooser
from .replication_state import Replication

if TYPE_CHECKING:
    from ..net.hooks import OpenConsole, OpenTrace, OpenTransactionLog, ServeMetrics
    from ..net.records import ClientRecord, ServerRecord, TransactionLog, WireTrace
    from ..net.unix_socket import UnixSocket
    from ..pooling.peer_pool import PeerPool
    from ..pooling.policies import Factories
    from ..pooling.pool import Pool
    from ..protocol.errors import PoolerError
    from ..settings import DatabaseEntry, Settings
    from .takeover_state import Takeover


class PoolerRecord(PoolerPort):
    """The running pooler's objects and switches (objects.py's Pooler acts on them)."""

    def __init__(self, settings: Settings, policy_factories: Factories) -> None:
        self.settings = settings
        # The keys every transaction reads, copied from `settings` by use_settings (a read
        # of the frozen dataclasses costs two dictionary lookups, these one field access).
        self.check_query = ""
        self.check_delay = 0.0
        self.pipeline_depth = 0
        self.histograms = False
        self.server_lifetime = 0.0
        self.reset_query_always = ""  # server_reset_query, if server_reset_query_always
        self.use_settings(settings)
        self.loop = asyncio.get_running_loop()
        # Not loop.time: uvloop's is cached per iteration at millisecond resolution, which
        # would round every transaction, query and wait time (SHOW STATS, histograms) to ms.
        self.now = time.monotonic
        self.start_time = time.time()
        self.pools: dict[tuple[str, str], Pool] = {}
        self.clients: set[ClientRecord] = set()
        self.login_clients: set[ClientRecord] = set()
        self.cancel_keys: dict[tuple[int, int], ClientRecord] = {}
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
        self.hba = HbaConfig()
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
        self.passing_clients = False  # and it serves now: each client paused at its release
        self.taken: Takeover | None = None
        self.stopped = self.loop.create_future()
        self.janitor_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Servers with writes deferred to the end of this round (net/deferred_writes.py).
        self.to_flush: list[ServerRecord] = []
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
        self.policy_factories = policy_factories
        self.open_txlog: OpenTransactionLog | None = None
        self.txlog: TransactionLog | None = None
        # The protocol trace (pooler/tracing.py), made through the hook cli.py sets once it is
        # first wanted; `trace_all` is it with `trace = on`, else None.
        self.open_trace: OpenTrace | None = None
        self.wire_trace: WireTrace | None = None
        self.trace_all: WireTrace | None = None
        # Replication clients waiting for their own server, and the joined pairs
        # (pooler/replication.py).
        self.replication = Replication()

    # --- decided from the fields alone ------------------------------------------------------

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

    def credentials_for(self, entry: DatabaseEntry, user: str) -> ServerCredentials:
        if entry.password:
            return ServerCredentials(user, password=entry.password)
        secret = self.auth_secrets.get(user) or self.auth_query_secrets.get(user)
        return server_credentials.from_secret(user, secret, self.scram_client_keys.get(user))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def use_settings(self, settings: Settings) -> None:
        """Make `settings` the pooler's (at start, and by lifecycle.apply_settings)."""
        self.settings = settings
        cfg = settings.pooler
        self.check_query = cfg.server_check_query
        self.check_delay = float(cfg.server_check_delay)
        self.pipeline_depth = int(cfg.pipeline_depth)
        # The wait and transaction time histograms are shown at /metrics and nowhere else:
        # kept only with the endpoint configured (metrics_port, which only a restart changes).
        self.histograms = bool(cfg.metrics_port)
        self.server_lifetime = float(cfg.server_lifetime)
        self.reset_query_always = (cfg.server_reset_query if cfg.server_reset_query_always
                                   else "")

    # --- the calls the parts make on one another through the pooler -----------------------
    # Carried out by objects.py's Pooler, each by handing over to the part that owns it.

    def load_auth(self) -> None:
        raise NotImplementedError

    def pool_for(self, database: str, user: str) -> Pool | None:
        raise NotImplementedError

    def launch_servers(self, pool: Pool) -> None:
        raise NotImplementedError

    def evict_idle(self, pool: Pool, same_db: bool, same_user: bool) -> bool:
        raise NotImplementedError

    def cap_room(self, pool: Pool, entry: DatabaseEntry) -> tuple[int | None, int | None]:
        raise NotImplementedError

    def entry_startup(self, entry: DatabaseEntry) -> dict[str, str]:
        raise NotImplementedError

    def open_server(self, pool: Pool, entry: DatabaseEntry,
                    startup: dict[str, str]) -> ServerRecord:
        raise NotImplementedError

    def server_closed(self, server: ServerRecord, reason: str) -> None:
        raise NotImplementedError

    def close_server(self, server: ServerRecord, reason: str) -> None:
        raise NotImplementedError

    def enter_pool(self, client: ClientRecord) -> Pool:
        raise NotImplementedError

    def login_failing(self, pool: Pool) -> PoolerError | None:
        raise NotImplementedError

    def client_closed(self, client: ClientRecord, reason: str) -> None:
        raise NotImplementedError

    def cancel_here(self, pid: int, secret: int) -> None:
        raise NotImplementedError

    def reload(self) -> bool:
        raise NotImplementedError

    def pause_all(self, paused: bool) -> None:
        raise NotImplementedError

    def shutdown(self, how: str) -> None:
        raise NotImplementedError

    def exit_now(self) -> None:
        raise NotImplementedError

    # --- the calls net/ makes into the pooler (net/records.py's PoolerPort) ----------------
    # Declared so that a part can hand the pooler to a connection.

    def client_connected(self, client: ClientRecord) -> None:
        raise NotImplementedError

    def forward_cancel(self, pid: int, secret: int) -> None:
        raise NotImplementedError

    def begin_authentication(self, client: ClientRecord) -> None:
        raise NotImplementedError

    def client_authenticated(self, client: ClientRecord, scram_key: bytes | None) -> None:
        raise NotImplementedError

    def request_server(self, client: ClientRecord, now: float = 0.0) -> None:
        raise NotImplementedError

    def session_changed(self, client: ClientRecord) -> None:
        raise NotImplementedError

    def pipeline(self, server: ServerRecord) -> None:
        raise NotImplementedError

    def ready_for_query(self, client: ClientRecord, status: int) -> None:
        raise NotImplementedError

    def message_sent(self, client: ClientRecord) -> None:
        raise NotImplementedError

    def parameters_applied(self, server: ServerRecord, client: ClientRecord) -> None:
        raise NotImplementedError

    def parameters_failed(self, server: ServerRecord, client: ClientRecord,
                          fields: dict[str, str]) -> None:
        raise NotImplementedError

    def check_failed(self, server: ServerRecord, client: ClientRecord | None,
                     why: str) -> None:
        raise NotImplementedError

    def server_logged_in(self, server: ServerRecord) -> None:
        raise NotImplementedError
