"""The Pooler: the running pooler's objects, and the calls the other layers make into it.

The Pooler owns every connection object and the bookkeeping around them: the pools by
(database, user) and the limits each is built with, the servers it opens and logs in
(per database and per user, under max_db_connections and max_user_connections), the
clients from their TCP connection through authentication (the auth_file, auth_query, the
cancel keys) to their close, and the servers with writes deferred to the end of the loop's
round. It decides nothing about who gets which server: the sans-IO Pool does, and
linking.py carries it out.

The client and server Protocols (net/) call in here at their turning points: a client
authenticated, a client needs a server, a transaction ended, a server logged in or closed.
Where the work belongs to another concept (linking.py, server_logins.py, cancel.py,
janitor.py, lifecycle.py), the method here only hands over, so those callers need know
nothing of the split.

Never forget a connection without its counts (servers_per_db, servers_per_user, the pool's
lists), and never leave a client whose server has closed without an error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Final

from ..auth.auth_file import load_auth_file
from ..auth.md5 import is_md5_hash
from ..auth.scram import ScramVerifier, is_scram_verifier
from ..core.link import LinkEvent, LinkState
from ..core.states import ClientEvent, ClientState, ServerEvent, ServerState
from ..net import hidden_queries, pipeline
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
from ..pooling import session_state as ss
from ..pooling.client_limits import ClientCounts
from ..pooling.peer_pool import PeerPool
from ..pooling.pool import Pool, PoolLimits
from ..pooling.prepared import Registry
from ..pooling.stats import StatsPeriods
from ..protocol import cancel_key, errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..settings import DatabaseEntry, Settings
from . import (
    auth_database,
    cancel,
    hba_login,
    lifecycle,
    linking,
    replication,
    research,
    server_logins,
    tracing,
    transactions,
)
from .host_lists import HostChooser
from .takeover import Takeover

log = logging.getLogger("pypool")

ADMIN_DATABASES: Final = ("pgbouncer", "pypool")
# PgBouncer's special console user: the pooler's own OS user, over the unix socket.
OWN_ADMIN_USER: Final = "pgbouncer"


@dataclass
class ServerCredentials:
    """What the pooler has to log into PostgreSQL as `user`."""

    user: str
    password: str | None = None
    md5_hash: str | None = None
    verifier: ScramVerifier | None = None
    scram_client_key: bytes | None = None


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
        self.auth_secrets: dict[str, str] = {}
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
        """(Re)read the auth_file. One that cannot be read keeps the users known so far
        (a reload must not lock everyone out because of a bad save)."""
        self.hba = hba_login.load(self.settings.pooler)
        known = dict(self.settings.inline_users)
        path = self.settings.pooler.auth_file
        if path:
            try:
                known.update(load_auth_file(path))
            except OSError as exc:
                log.error("auth_file %s: cannot read: %s; keeping the users known so far",
                          path, exc.strerror)
                return
            except UnicodeDecodeError as bad:  # own name: mypyc types a name by its first except
                log.error("auth_file %s: not UTF-8 (byte %d); keeping the users known so far",
                          path, bad.start)
                return
        self.auth_secrets = known

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
        creds = ServerCredentials(user)
        if entry.password:
            creds.password = entry.password
            return creds
        secret = self.auth_secrets.get(user) or self.auth_query_secrets.get(user)
        if secret is None:
            return creds
        if is_scram_verifier(secret):
            creds.verifier = ScramVerifier.parse(secret)
            creds.scram_client_key = self.scram_client_keys.get(user)
        elif is_md5_hash(secret):
            creds.md5_hash = secret
        else:
            creds.password = secret
        return creds

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
        """Forget a server that is gone; its client, if it had one, gets an error."""
        if server.state is ServerState.CLOSED:
            return
        server.on(ServerEvent.CLOSED)
        if server.trace is not None:
            server.trace.server_gone(server)
        pool = server.pool
        pool.forget(server)
        server.statements.close()
        self.servers_per_db[pool.database] = self.servers_per_db.get(pool.database, 1) - 1
        self.servers_per_user[pool.user] = self.servers_per_user.get(pool.user, 1) - 1
        if replication.is_dedicated(server):
            replication.server_closed(self, server, reason)  # its client goes, unfailed
        if server.checking and server.client is not None:
            # It died under server_check_query, before any of its client's requests.
            server.backend.checking = False
            linking.check_failed(self, server, server.client, reason)
        line = [server.client, *server.chain]
        server.link(None)
        server.chain.clear()
        for client in line:
            if client is not None:
                client.server = None
                pool.stats.count_error("server_conn_crashed")
                client.fail(PoolerError("server conn crashed?", errors.PROTOCOL_VIOLATION))
        if self.settings.pooler.log_disconnections and not reason.startswith("login failed"):
            log.info("%r: closing because: %s", server, reason)
        self.launch_servers(pool)

    def close_server(self, server: ServerConnection, reason: str) -> None:
        """Close a server; an idle one is taken out of the idle stack first, so no client is
        handed a closing server before its connection_lost arrives."""
        if server.state is ServerState.IDLE:
            server.pool.forget(server)
        server.close(reason)

    # --- clients --------------------------------------------------------------------------

    def client_connected(self, client: ClientConnection) -> None:
        if client.state is not ClientState.STARTUP:
            return  # taken over from another process (-R): logged in, or refused, already
        self.clients.add(client)
        self.login_clients.add(client)

    def begin_authentication(self, client: ClientConnection) -> None:
        cfg = self.settings.pooler
        if self.wire_trace is not None:
            tracing.named(self, client)  # traced by its application_name
        if self.shutting_down and client.database not in ADMIN_DATABASES:
            # As PgBouncer 1.25: the unix socket, open until the exit, still lets the console
            # in (to see what the shutdown waits for, or KILL_CLIENT it), and no one else.
            raise PoolerError("pooler is shutting down", errors.ADMIN_SHUTDOWN)
        # The admin console stays reachable when the clients are at their cap, as PgBouncer
        # exempts it: that is when an operator needs it most.
        if len(self.clients) > cfg.max_client_conn and client.database not in ADMIN_DATABASES:
            raise PoolerError("no more connections allowed (max_client_conn)",
                              errors.TOO_MANY_CONNECTIONS)
        if (client.database in ADMIN_DATABASES and client.user == OWN_ADMIN_USER
                and client.peer_uid is not None and client.peer_uid == os.getuid()):
            # As PgBouncer's admin_pre_login: over the unix socket, the OS user running the
            # pooler reaches the console as `pgbouncer` with no password, whatever auth_type
            # and auth_file say (operators and PgBouncer's test suite log in so). Over TCP
            # the uid is unknown and `pgbouncer` is an ordinary user name.
            client.own_user = True
            self.client_counts.admit(self.settings, client)
            if cfg.log_connections:
                log.info("%r: pgbouncer access from unix socket", client)
            assert client.login is not None  # logging in
            client.login.start_auth(None, "trust")
            return
        self.client_counts.admit(self.settings, client)
        auth_type = cfg.auth_type
        if auth_type == "hba":  # the hba file picks the method for this client
            auth_type = hba_login.method_for(self.hba, client)
        secret = self.auth_secrets.get(client.user)
        if (secret is None and client.database in ADMIN_DATABASES and cfg.auth_user
                and auth_type != "any"):
            # A console user known to PostgreSQL only: auth_query through auth_dbname.
            via = auth_database.for_console(self.settings, self.disabled_dbs, client)
            self.spawn(self._auth_query(client, via, cfg.auth_user, auth_type, cfg.auth_query))
            return
        if secret is None and client.database not in ADMIN_DATABASES and auth_type != "any":
            entry = self.settings.database(client.database)
            auth_user = (entry and entry.auth_user) or cfg.auth_user
            if entry is not None and auth_user:
                # auth_dbname: the connection auth_query runs on (pooler/auth_database.py).
                via = auth_database.resolve(self.settings, self.disabled_dbs, entry, client)
                query = entry.auth_query or cfg.auth_query
                self.spawn(self._auth_query(client, via, auth_user, auth_type, query))
                return
        _start_auth(client, secret, auth_type)

    async def _auth_query(self, client: ClientConnection, entry: DatabaseEntry,
                          auth_user: str, auth_type: str, query: str) -> None:
        from ..net.auth_query import AuthQueryFailed, AuthQueryLoginFailed, run_auth_query

        secret = None
        found = False
        try:
            found, secret = await run_auth_query(
                entry, auth_user, self.credentials_for(dataclasses.replace(entry, password=""),
                                                       auth_user),
                query, client.user,
            )
        except AuthQueryLoginFailed as refused:
            # As a failed server login: logged, and the client told the server's words.
            log.warning("%r: server login failed: %s %s", client, refused.severity,
                        refused.message)
            client.fail(PoolerError(refused.message))
            return
        except AuthQueryFailed as broken:
            log.error("%r: auth_query failed: %s", client, broken)
            client.fail(PoolerError("bouncer config error"))
            return
        except Exception as failure:  # noqa: BLE001 - any other failure means "unknown user"
            log.warning("%r: auth_query failed: %s", client, failure)
        if secret:
            self.auth_query_secrets[client.user] = secret
        if auth_type == "trust" and not found and client.state is ClientState.STARTUP:
            # Trust asks for no password, so there is no exchange to mock and nothing to hide
            # (any known name logs in): as PgBouncer, the client hears that auth_query found
            # no such user. The password methods keep the mock exchange (COMPAT.md).
            log.info("%r: no such user: %s", client, client.user)
            client.fail(PoolerError("no such user"))
            return
        if client.state is ClientState.STARTUP:
            try:
                _start_auth(client, secret, auth_type, known=found)
            except PoolerError as exc:
                client.fail(exc)

    def client_authenticated(self, client: ClientConnection, scram_key: bytes | None) -> None:
        self.login_clients.discard(client)
        if scram_key is not None:
            self.scram_client_keys[client.user] = scram_key
        while True:
            # Unpredictable: a guessed key would let one client cancel another's queries.
            key = cancel_key.issue(secrets.randbits(31), secrets.randbits(32),
                                   self.settings.pooler.peer_id, self.worker_index)
            if key not in self.cancel_keys:
                break
        client.cancel_key = key
        if client.database in ADMIN_DATABASES:
            if self.open_console is None:
                raise PoolerError(f"no such database: {client.database}",
                                  errors.PROTOCOL_VIOLATION)
            self.open_console(client)
            return
        pool = self.enter_pool(client)
        if self.settings.pooler.application_name_add_host:
            # As PgBouncer: the peer's address after the name, set once, at login.
            name = client.params.get("application_name") or "app"
            client.params["application_name"] = f"{name} - {client.peer[0]}:{client.peer[1]}"
        self.cancel_keys[key] = client
        if replication.wants_own_server(client):
            replication.client_authenticated(self, client, pool)  # welcomed by its server
            return
        failing = self.login_failing(pool)
        if failing is not None:
            raise failing
        if pool.server_params is not None:
            client.welcome(pool.server_params)
            return
        pool.awaiting_params.append(client)
        self.launch_servers(pool)

    def enter_pool(self, client: ClientConnection) -> Pool:
        """The client joins the pool of its database and user (at login, or taken over by
        -R); an unknown or DISABLEd database refuses it."""
        entry = self.settings.database(client.database)
        if entry is None:
            raise PoolerError(f"no such database: {client.database}", errors.PROTOCOL_VIOLATION)
        pool = self.pool_for(client.database, client.user)
        assert pool is not None
        if pool.disabled:
            raise PoolerError(f'database "{client.database}" is disabled')
        client.pool = pool
        pool.clients.add(client)
        return pool

    def login_failing(self, pool: Pool) -> PoolerError | None:
        return server_logins.login_failing(self, pool)

    def client_closed(self, client: ClientConnection, reason: str) -> None:
        if client.state is ClientState.CLOSED:
            return
        if self.txlog is not None:
            self.txlog.client_closed(client, reason)  # mid-transaction, or while waiting
        if client.trace is not None:
            client.trace.client_gone(client)
        # Whether its requests were waiting for a check or SET on its server (whose replies
        # would be taken for the next client's), before its link ends.
        setting = client.link.state is LinkState.SETTING
        client.on(ClientEvent.CLOSED)
        client.on_link(LinkEvent.GONE)
        self.clients.discard(client)
        self.login_clients.discard(client)
        self.client_counts.forget(client)
        self.cancel_keys.pop(client.cancel_key, None)
        pool = client.pool
        if pool is not None:
            pool.clients.discard(client)
            pool.unqueue(client)
            if client in pool.awaiting_params:
                pool.awaiting_params.remove(client)
        if self.replication.in_use():
            replication.client_closed(self, client)  # its own server goes with it
        server = client.server
        if server is not None and (server.chain or server.client is not client
                                   or pipeline.skipped_in_line(client)):
            # In a pipeline: its requests are on the server, between others'. It keeps its
            # place until its replies have gone by (net/pipeline.py), unless a segment of it
            # will never end. So does one refused by its guard: only a ReadyForQuery is left.
            if client.ledger.unsynced:
                server.close("client disconnected with a query in progress")
        elif server is not None:
            client.server = None
            server.link(None)
            server.resume_reading()
            # A check or SET the pooler sent for this client may still be answering: its
            # replies and ParameterStatus would be taken for the next client's.
            clean = (client.ledger.idle() and client.tx_status == m.TX_IDLE
                     and not setting and not server.checking)
            if clean and not server.statements.detach():
                clean = False  # prepared-statement replies still owed: see release()
            why = "client disconnected with a transaction or query in progress"
            session = client.session
            if clean and session is not None and session.pins:
                # Pinned (pooling/session_state.py): what pinned it goes before anyone else
                # has the server; a LOADed library cannot be unloaded.
                if ss.LOAD in session.pins:
                    clean, why = False, "its client LOADed a library, which stays loaded"
                else:
                    hidden_queries.send_hidden_query(server, "DISCARD ALL")
                    server.session_sets.clear()
            if clean:
                cfg = self.settings.pooler
                assert pool is not None
                if cfg.server_reset_query and (
                    pool.limits.pool_mode == "session" or cfg.server_reset_query_always
                ):
                    hidden_queries.send_hidden_query(server, cfg.server_reset_query)
                linking.server_available(self, server)
            else:
                server.close(why)
        if client.statements is not None:
            client.statements.close()
        if self.settings.pooler.log_disconnections and client.user:
            log.info("%r: closing because: %s", client, reason)
        lifecycle.maybe_exit(self)

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
        transactions.session_changed(client)

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


def _start_auth(client: ClientConnection, secret: str | None, auth_type: str,
                known: bool = False) -> None:
    """As PgBouncer: trust lets in only users the pooler knows (auth_file, or found by
    auth_query, `known`, with or without a password)."""
    if auth_type == "trust" and secret is None and not known:
        raise PoolerError('"trust" authentication failed', side=errors.Side.CLIENT)
    assert client.login is not None  # logging in
    client.login.start_auth(secret, auth_type)
