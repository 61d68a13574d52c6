"""The pooler: listeners, pools, the link between a client and a server, the janitor.

It owns every connection object and decides, through the sans-IO Pool, who gets which
server. The client and server Protocols call in here at their turning points: a client
authenticated, a client needs a server, a transaction ended, a server logged in or closed.

Never hand a server on with replies owed, never give a server mid-transaction to another
client: a client that leaves with its transaction open (or a query running) takes its server
down with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from .. import compiled
from ..auth.auth_file import load_auth_file
from ..auth.md5 import is_md5_hash
from ..auth.scram import ScramVerifier, is_scram_verifier
from ..core.states import ClientEvent, ClientState, ServerEvent, ServerState
from ..pooling.params import covers
from ..pooling.pool import Pool, PoolLimits
from ..pooling.prepared import Registry
from ..pooling.stats import StatsPeriods, stats_line
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..settings import (
    RESTART_ONLY_KEYS,
    DatabaseEntry,
    Settings,
    SettingsError,
    load_ini,
    worker_share,
)
from . import pipeline
from .client import ClientConnection
from .hooks import OpenConsole, ServeMetrics
from .server import ServerConnection, ServerLoginError

log = logging.getLogger("pypool")

ADMIN_DATABASES = ("pgbouncer", "pypool")
JANITOR_PERIOD = 0.5
# How long a CancelRequest may take to reach PostgreSQL (PgBouncer's cancel_wait_timeout).
CANCEL_WAIT_TIMEOUT = 10.0
# How many servers in a row may fail server_check_query for one client before it is told.
CHECK_ATTEMPTS = 3
# PgBouncer's text for query_wait_notify.
WAIT_NOTICE = "No server connection available in postgres backend, client being queued"


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
        self.loop = asyncio.get_running_loop()
        # Not loop.time: uvloop's is cached per iteration at millisecond resolution, which
        # would round every transaction, query and wait time (SHOW STATS, histograms) to ms.
        self.now = time.monotonic
        self.start_time = time.time()
        self.pools: dict[tuple[str, str], Pool] = {}
        self.clients: set[ClientConnection] = set()
        self.login_clients: set[ClientConnection] = set()
        self.cancel_keys: dict[tuple[int, int], ClientConnection] = {}
        self.servers_per_db: dict[str, int] = {}
        self.servers_per_user: dict[str, int] = {}
        self.auth_secrets: dict[str, str] = {}
        self.auth_query_secrets: dict[str, str] = {}
        self.scram_client_keys: dict[str, bytes] = {}
        # Prepared statements by Parse body, shared by all pools (pooling/prepared/).
        self.statement_registry = Registry()
        self.listeners: list[asyncio.AbstractServer] = []
        self.shutting_down = ""  # "", "SIGINT" (drain transactions) or "SIGTERM" (drain clients)
        self.stopped = self.loop.create_future()
        self._janitor: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._to_flush: list[ServerConnection] = []  # servers with deferred writes
        # The operator's switches (admin console, SIGUSR1/2): PAUSE of everything or of some
        # databases, DISABLE; databases gone from the config whose clients are still here.
        self.paused_all = False
        self.paused_dbs: set[str] = set()
        self.disabled_dbs: set[str] = set()
        self.retired: dict[str, DatabaseEntry] = {}
        self.stats_periods = StatsPeriods(self.now())  # SHOW STATS averages, the stats line
        self.metrics_servers: list[asyncio.AbstractServer] = []
        # The console and the metrics endpoint, plugged in at start-up (cli.build_pooler):
        # net/ never imports them. None: no console, no metrics (net/hooks.py).
        self.open_console: OpenConsole | None = None
        self.serve_metrics: ServeMetrics | None = None
        self.load_auth()

    # --- start, reload, stop --------------------------------------------------------------

    def load_auth(self) -> None:
        known = dict(self.settings.inline_users)
        path = self.settings.pooler.auth_file
        if path:
            try:
                known.update(load_auth_file(path))
            except OSError as exc:
                log.error("auth_file %s: cannot read: %s", path, exc.strerror)
        self.auth_secrets = known

    async def start(self) -> None:
        cfg = self.settings.pooler
        if cfg.metrics_port and self.serve_metrics is not None:  # first: up before clients
            self.metrics_servers = await self.serve_metrics(
                cfg.metrics_addr or cfg.listen_addr, cfg.metrics_port
            )
        # "*" is every address: None to create_server. (One list, typed for that: compiled,
        # a list[str] holding None raises TypeError.)
        hosts: list[str | None] = [
            None if h.strip() == "*" else h.strip() for h in cfg.listen_addr.split(",")
            if h.strip()
        ]
        for host in hosts:
            server = await self.loop.create_server(
                lambda: ClientConnection(self),
                host,
                cfg.listen_port,
                reuse_port=cfg.so_reuseport or cfg.workers > 1,
                backlog=2048,
            )
            self.listeners.append(server)
        log.info("listening on %s:%d; hot path: %s", cfg.listen_addr, cfg.listen_port,
                 compiled.status)
        self._janitor = self.loop.create_task(self._janitor_loop())
        self._spawn(self._stats_loop())
        for pool_key in self._min_pool_keys():
            self.pool_for(*pool_key)
        self._pidfile()

    def _pidfile(self) -> None:
        if self.settings.pooler.pidfile:
            with open(self.settings.pooler.pidfile, "w") as fh:
                fh.write(f"{os.getpid()}\n")

    def _min_pool_keys(self) -> list[tuple[str, str]]:
        keys = []
        for name, entry in self.settings.databases.items():
            min_size = entry.min_pool_size
            if min_size is None:
                min_size = self.settings.pooler.min_pool_size
            if name != "*" and entry.user and min_size > 0:
                keys.append((name, entry.user))
        return keys

    def reload(self) -> bool:
        """Re-read the ini and the auth_file; keep the old config if the new one is bad."""
        if not self.settings.path:
            self.load_auth()
            return True
        try:
            new = worker_share(load_ini(self.settings.path), self.settings.pooler.workers)
        except SettingsError as exc:
            log.error("reload failed, keeping the old configuration: %s", exc)
            return False
        self.apply_settings(new)
        log.info("configuration reloaded from %s", new.path)
        return True

    def apply_settings(self, new: Settings) -> None:
        """Switch to `new` (RELOAD, SIGHUP, SET) without dropping anyone.

        Sizes and timeouts apply to the next assignment. A database whose connection details
        changed gets its servers replaced as they are released. A database gone from the
        config refuses new clients; its connected clients keep being served until they leave.
        Keys that only apply at start keep their old values.
        """
        old = self.settings
        kept = {}
        for key in RESTART_ONLY_KEYS:
            if getattr(new.pooler, key) != getattr(old.pooler, key):
                log.warning("%s changed: takes effect at restart", key)
                kept[key] = getattr(old.pooler, key)
        if kept:
            new = dataclasses.replace(new, pooler=dataclasses.replace(new.pooler, **kept))
        self.settings = new
        self.load_auth()
        for pool in list(self.pools.values()):
            entry = new.database(pool.database)
            old_entry = old.database(pool.database) or self.retired.get(pool.database)
            if entry is None:
                if not pool.removed and old_entry is not None:
                    log.warning("database %s removed from the config: new clients refused, "
                                "%d connected clients carry on", pool.database, len(pool.clients))
                    self.retired[pool.database] = old_entry
                pool.removed = True
                pool.limits = dataclasses.replace(pool.limits, min_pool_size=0)
                continue
            if pool.removed:
                pool.removed = False
                self.retired.pop(pool.database, None)
            pool.limits = self.limits_for(entry, pool.user)
            if old_entry is not None and _server_side(old_entry) != _server_side(entry):
                self.tag_dirty(pool, "database configuration changed")
            surplus = pool.server_count - pool.limits.pool_size - pool.limits.reserve_pool_size
            for server in pool.idle[:max(0, surplus)]:
                self.close_server(server, "pool_size lowered")
            self.launch_servers(pool)
            self._serve_waiting(pool)

    def shutdown(self, how: str) -> None:
        """SIGINT: let transactions finish. SIGTERM: let clients finish. Again: exit now."""
        if self.shutting_down or how == "now":
            self._exit()
            return
        log.info("%s: shutting down once %s finish", how,
                 "transactions" if how == "SIGINT" else "clients")
        self.shutting_down = how
        for listener in self.listeners:
            listener.close()
        if self.settings.pooler.shutdown_timeout:
            self.loop.call_later(self.settings.pooler.shutdown_timeout, self._exit)
        if how == "SIGINT":
            for client in list(self.clients):
                if client.server is None:
                    client.fail(PoolerError("pooler is shutting down", errors.ADMIN_SHUTDOWN))
                else:
                    client.close_after_release = True
        self._maybe_exit()

    def _maybe_exit(self) -> None:
        # Console sessions do not hold up a shutdown: they are how it was asked for.
        if self.shutting_down and all(client.admin is not None for client in self.clients):
            self._exit()

    def _exit(self) -> None:
        for client in list(self.clients):
            client.close("pooler exit")
        for pool in self.pools.values():
            for server in list(pool.idle) + list(pool.active) + list(pool.login):
                server.close("pooler exit")
        for metrics_server in self.metrics_servers:
            metrics_server.close()
        pidfile = self.settings.pooler.pidfile
        if pidfile and not self.stopped.done():
            try:
                os.unlink(pidfile)
            except OSError:
                pass
        if not self.stopped.done():
            self.stopped.set_result(None)

    def install_signals(self) -> None:
        loop = self.loop
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        loop.add_signal_handler(signal.SIGINT, self.shutdown, "SIGINT")
        loop.add_signal_handler(signal.SIGTERM, self.shutdown, "SIGTERM")
        loop.add_signal_handler(signal.SIGQUIT, self.shutdown, "now")
        loop.add_signal_handler(signal.SIGUSR1, self.pause_all, True)
        loop.add_signal_handler(signal.SIGUSR2, self.pause_all, False)

    def pause_all(self, paused: bool) -> None:
        """PAUSE / RESUME of every database (also SIGUSR1 / SIGUSR2)."""
        log.info("%s all databases", "pausing" if paused else "resuming")
        self.paused_all = paused
        for pool in self.pools.values():
            self.set_paused(pool, paused or pool.database in self.paused_dbs)

    def set_paused(self, pool: Pool, paused: bool) -> None:
        """Paused: no server is handed out, idle ones close now, busy ones once released
        (server_available), and waiting clients wait. Resumed: serve them again."""
        pool.paused = paused
        if paused:
            for server in list(pool.idle):
                self.close_server(server, "pause mode")
        else:
            self.launch_servers(pool)
            self._serve_waiting(pool)

    def tag_dirty(self, pool: Pool, reason: str) -> None:
        """RECONNECT: replace every server of the pool: idle ones now, busy ones once released,
        logging-in ones once logged in (closing those now would fail the clients waiting for
        the pool's first login, and block new logins for server_login_retry)."""
        pool.close_needed = set(pool.active) | set(pool.idle) | set(pool.login)
        for server in list(pool.idle):
            self.close_server(server, reason)
        self.launch_servers(pool)

    def close_server(self, server: ServerConnection, reason: str) -> None:
        """Close a server; an idle one is taken out of the idle stack first, so no client is
        handed a closing server before its connection_lost arrives."""
        if server.state is ServerState.IDLE:
            server.pool.forget(server)
        server.close(reason)

    # --- pools ----------------------------------------------------------------------------

    def limits_for(self, entry: DatabaseEntry, user: str) -> PoolLimits:
        cfg = self.settings.pooler
        user_entry = self.settings.users.get(user)

        def pick(*values: int | str | None) -> int | str:
            return next(v for v in values if v is not None)

        return PoolLimits(
            pool_size=int(pick(entry.pool_size, user_entry.pool_size if user_entry else None,
                               cfg.default_pool_size)),
            min_pool_size=int(pick(entry.min_pool_size, cfg.min_pool_size)),
            reserve_pool_size=int(pick(entry.reserve_pool_size, cfg.reserve_pool_size)),
            reserve_pool_timeout=cfg.reserve_pool_timeout,
            pool_mode=str(pick(user_entry.pool_mode if user_entry else None, entry.pool_mode,
                               cfg.pool_mode)),
        )

    def pool_for(self, database: str, user: str) -> Pool | None:
        entry = self.settings.database(database)
        if entry is None:
            return None
        user = entry.user or user
        key = (database, user)
        pool = self.pools.get(key)
        if pool is None:
            pool = Pool(database, user, self.limits_for(entry, user))
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
        if pool.paused or self.shutting_down == "now":
            return
        now = self.now()
        if pool.login_error is not None:
            if now - pool.login_error[1] < self.settings.pooler.server_login_retry:
                return
        cfg = self.settings.pooler
        entry = self.settings.database(pool.database) or self.retired.get(pool.database)
        if entry is None:
            return
        room_db = room_user = 1 << 30
        max_db = entry.max_db_connections or cfg.max_db_connections
        if max_db:
            room_db = max_db - self.servers_per_db.get(pool.database, 0)
        user_entry = self.settings.users.get(pool.user)
        max_user = (user_entry and user_entry.max_user_connections) or cfg.max_user_connections
        if max_user:
            room_user = max_user - self.servers_per_user.get(pool.user, 0)
        oldest = pool.waiting[0].wait_start if pool.waiting else None
        wanted = pool.servers_wanted(now, oldest, room_db, room_user)
        if not wanted and min(room_db, room_user) <= 0 and pool.servers_wanted(
            now, oldest, 1 << 30, 1 << 30
        ):
            # Only max_db_connections / max_user_connections stand in the way: as PgBouncer
            # (evict_connection), close another pool's idle server to make room, or an idle
            # pool would starve a busy one forever.
            if self._evict_idle(pool, same_db=room_db <= 0, same_user=room_user <= 0):
                self.launch_servers(pool)
            return
        for _ in range(wanted):
            self._open_server(pool, entry)

    def _evict_idle(self, pool: Pool, same_db: bool, same_user: bool) -> bool:
        """Close the longest-idle server of another pool under the same exhausted cap."""
        candidates = [
            server
            for other in self.pools.values()
            if other is not pool
            and (not same_db or other.database == pool.database)
            and (not same_user or other.user == pool.user)
            for server in other.idle
        ]
        if not candidates:
            return False
        victim = min(candidates, key=lambda server: server.request_time)
        victim.close("evicted to make room for another pool")
        self.server_closed(victim, "evicted to make room for another pool")
        return True

    def _open_server(self, pool: Pool, entry: DatabaseEntry) -> None:
        startup: dict[str, str] = {}
        if entry.application_name:
            startup["application_name"] = entry.application_name
        for key, name in (("client_encoding", "client_encoding"), ("datestyle", "DateStyle"),
                          ("timezone", "TimeZone")):
            value = getattr(entry, key)
            if value:
                startup[name] = value
        server = ServerConnection(
            self, pool, entry.host, entry.port, entry.server_dbname,
            self.credentials_for(entry, pool.user), startup,
        )
        pool.login.add(server)
        self.servers_per_db[pool.database] = self.servers_per_db.get(pool.database, 0) + 1
        self.servers_per_user[pool.user] = self.servers_per_user.get(pool.user, 0) + 1
        self._spawn(self._connect(server))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, server: ServerConnection) -> None:
        timeout = self.settings.pooler.server_connect_timeout or None
        try:
            async with asyncio.timeout(timeout):
                await self.loop.create_connection(lambda: server, server.host, server.port)
                await server.ready
        except ServerLoginError as exc:
            self._login_failed(server, exc.args[0], exc.error)
        except (OSError, TimeoutError) as failure:  # own name: mypyc types `exc` above
            reason = "server connect timeout" if isinstance(failure, TimeoutError) else str(failure)
            text = f"server connection failed: {reason}"
            self._login_failed(server, text, m.error_response(text, "08006", "FATAL"))

    def _login_failed(self, server: ServerConnection, text: str, error: bytes) -> None:
        pool = server.pool
        log.warning("%r: server login failed: %s", server, text)
        pool.login_error = (error, self.now())
        pool.stats.count_error("server_login_failed")
        server.close(f"login failed: {text}")
        self.server_closed(server, f"login failed: {text}")
        # The clients waiting for this login get the server's own error; so do those queued
        # when no server is left to serve them (they would wait query_wait_timeout for
        # nothing: no login is tried again before server_login_retry).
        stranded = list(pool.awaiting_params)
        pool.awaiting_params.clear()
        if not pool.idle and not pool.active and not pool.login:
            stranded += [client for client in pool.waiting if client.state is ClientState.WAITING]
            pool.waiting.clear()
        for client in stranded:
            client.write(error)
            client.close("server login failed")

    def server_logged_in(self, server: ServerConnection) -> None:
        pool = server.pool
        pool.login_error = None
        if pool.server_params is None:
            pool.server_params = dict(server.params)
        if self.settings.pooler.log_connections:
            log.info("%r: new server connection", server)
        waiting_for_params, pool.awaiting_params = pool.awaiting_params, []
        for client in waiting_for_params:
            if client.state is ClientState.WELCOME:
                client.welcome(pool.server_params)
        entry = self.settings.database(pool.database) or self.retired.get(pool.database)
        if entry is not None and entry.connect_query:
            # Before any client: its replies are hidden, the first client's requests follow.
            server.send_hidden_query(entry.connect_query)
        self.server_available(server)

    def server_closed(self, server: ServerConnection, reason: str) -> None:
        """Forget a server that is gone; its client, if it had one, gets an error."""
        if server.state is ServerState.CLOSED:
            return
        server.on(ServerEvent.CLOSED)
        pool = server.pool
        pool.forget(server)
        server.statements.close()
        self.servers_per_db[pool.database] = self.servers_per_db.get(pool.database, 1) - 1
        self.servers_per_user[pool.user] = self.servers_per_user.get(pool.user, 1) - 1
        if server.checking and server.client is not None:
            # It died under server_check_query, before any of its client's requests.
            server.checking = False
            self.check_failed(server, server.client, reason)
        line = [server.client, *server.chain]
        server.client = None
        server.chain.clear()
        for client in line:
            if client is not None:
                client.server = None
                pool.stats.count_error("server_conn_crashed")
                client.fail(PoolerError("server conn crashed?", errors.PROTOCOL_VIOLATION))
        if self.settings.pooler.log_disconnections and not reason.startswith("login failed"):
            log.info("%r: closing because: %s", server, reason)
        self.launch_servers(pool)

    # --- clients --------------------------------------------------------------------------

    def client_connected(self, client: ClientConnection) -> None:
        self.clients.add(client)
        self.login_clients.add(client)

    def begin_authentication(self, client: ClientConnection) -> None:
        cfg = self.settings.pooler
        if self.shutting_down:
            raise PoolerError("pooler is shutting down", errors.ADMIN_SHUTDOWN)
        # The admin console stays reachable when the clients are at their cap, as PgBouncer
        # exempts it: that is when an operator needs it most.
        if len(self.clients) > cfg.max_client_conn and client.database not in ADMIN_DATABASES:
            raise PoolerError("no more connections allowed (max_client_conn)",
                              errors.TOO_MANY_CONNECTIONS)
        secret = self.auth_secrets.get(client.user)
        if secret is None and client.database not in ADMIN_DATABASES and cfg.auth_type not in (
            "trust", "any"
        ):
            entry = self.settings.database(client.database)
            auth_user = (entry and entry.auth_user) or cfg.auth_user
            if entry is not None and auth_user:
                self._spawn(self._auth_query(client, entry, auth_user))
                return
        client.start_auth(secret, cfg.auth_type)

    async def _auth_query(self, client: ClientConnection, entry: DatabaseEntry,
                          auth_user: str) -> None:
        from .auth_query import run_auth_query

        secret = None
        try:
            secret = await run_auth_query(
                entry, auth_user, self.credentials_for(dataclasses.replace(entry, password=""),
                                                       auth_user),
                self.settings.pooler.auth_query, client.user,
            )
        except Exception as failure:  # noqa: BLE001 - any failure means "unknown user"
            log.warning("%r: auth_query failed: %s", client, failure)
        if secret:
            self.auth_query_secrets[client.user] = secret
        if client.state is ClientState.STARTUP:
            try:
                client.start_auth(secret, self.settings.pooler.auth_type)
            except PoolerError as exc:
                client.fail(exc)

    def client_authenticated(self, client: ClientConnection, scram_key: bytes | None) -> None:
        self.login_clients.discard(client)
        if scram_key is not None:
            self.scram_client_keys[client.user] = scram_key
        while True:
            # Unpredictable: a guessed key would let one client cancel another's queries.
            key = (secrets.randbits(31), secrets.randbits(32))
            if key not in self.cancel_keys:
                break
        client.cancel_key = key
        if client.database in ADMIN_DATABASES:
            if self.open_console is None:
                raise PoolerError(f"no such database: {client.database}",
                                  errors.PROTOCOL_VIOLATION)
            self.open_console(client)
            return
        entry = self.settings.database(client.database)
        if entry is None:
            raise PoolerError(f"no such database: {client.database}", errors.PROTOCOL_VIOLATION)
        pool = self.pool_for(client.database, client.user)
        assert pool is not None
        if pool.disabled:
            raise PoolerError(f'database "{client.database}" is disabled')
        client.pool = pool
        pool.clients.add(client)
        if self.settings.pooler.application_name_add_host:
            # As PgBouncer: the peer's address after the name, set once, at login.
            name = client.params.get("application_name") or "app"
            client.params["application_name"] = f"{name} - {client.peer[0]}:{client.peer[1]}"
        self.cancel_keys[key] = client
        failing = self.login_failing(pool)
        if failing is not None:
            raise failing
        if pool.server_params is not None:
            client.welcome(pool.server_params)
            return
        pool.awaiting_params.append(client)
        self.launch_servers(pool)

    def login_failing(self, pool: Pool) -> PoolerError | None:
        """The error for a client that needs a server while the pool's logins are failing
        and it has none to serve with (PgBouncer 1.25): at once, rather than after
        query_wait_timeout; None when the pool may serve."""
        failed = pool.login_error
        if failed is None or pool.idle or pool.active:
            return None
        if self.now() - failed[1] >= self.settings.pooler.server_login_retry:
            return None
        fields = m.parse_error_fields(failed[0][5:])
        return PoolerError(
            f"server login has been failing, cached error: {fields.get('M', '')} "
            "(server_login_retry)"
        )

    def client_closed(self, client: ClientConnection, reason: str) -> None:
        if client.state is ClientState.CLOSED:
            return
        client.on(ClientEvent.CLOSED)
        self.clients.discard(client)
        self.login_clients.discard(client)
        self.cancel_keys.pop(client.cancel_key, None)
        pool = client.pool
        if pool is not None:
            pool.clients.discard(client)
            pool.unqueue(client)
            if client in pool.awaiting_params:
                pool.awaiting_params.remove(client)
        server = client.server
        if server is not None and (server.chain or server.client is not client):
            # In a pipeline: its requests are on the server, between others'. It keeps its
            # place until its replies have gone by (net/pipeline.py), unless a segment of it
            # will never end.
            if client.ledger.unsynced:
                server.close("client disconnected with a query in progress")
        elif server is not None:
            client.server = None
            server.client = None
            server.resume_reading()
            clean = client.ledger.idle() and client.tx_status == m.TX_IDLE
            if clean and not server.statements.detach():
                clean = False  # prepared-statement replies still owed: see release()
            if clean:
                cfg = self.settings.pooler
                assert pool is not None
                if cfg.server_reset_query and (
                    pool.limits.pool_mode == "session" or cfg.server_reset_query_always
                ):
                    server.send_hidden_query(cfg.server_reset_query)
                self.server_available(server)
            else:
                server.close("client disconnected with a transaction or query in progress")
        if client.statements is not None:
            client.statements.close()
        if self.settings.pooler.log_disconnections and client.user:
            log.info("%r: closing because: %s", client, reason)
        self._maybe_exit()

    # --- linking clients and servers ------------------------------------------------------

    def request_server(self, client: ClientConnection) -> None:
        """The client has sent something that needs a server."""
        pool = client.pool
        assert pool is not None
        if not pool.paused:
            server = pool.take_idle()
            if server is not None:
                self.link(client, server)
                return
            if (pool.open_lines and pool.server_count >= pool.limits.pool_size
                    and pipeline.join_open_line(self, client)):
                return
        failing = self.login_failing(pool)
        if failing is not None:
            client.fail(failing)
            return
        client.on(ClientEvent.QUEUED)
        client.wait_start = client.state_since
        client.wait_notified = False
        pool.enqueue(client)
        limits = pool.limits
        if pool.server_count < limits.pool_size + limits.reserve_pool_size:
            self.launch_servers(pool)  # else there is no room for another server anyway

    def link(self, client: ClientConnection, server: ServerConnection) -> None:
        pool = server.pool
        now = self.now()
        cfg = self.settings.pooler
        # server_check_query: a server free for server_check_delay is checked before use.
        check = cfg.server_check_query if cfg.server_check_query and (
            now - server.request_time >= cfg.server_check_delay) else ""
        if client.state is ClientState.WAITING:
            pool.stats.wait_time_us += int((now - client.wait_start) * 1e6)
            pool.stats.wait_histogram.observe(now - client.wait_start)
        pool.login.discard(server)
        pool.active.add(server)
        client.server = server
        server.client = client
        client.on(ClientEvent.LINKED)
        server.on(ServerEvent.LINKED)
        client.link_time = now
        server.request_time = now
        pool.stats.server_assignment_count += 1
        carry_back_pressure(client, server)
        if check or not covers(server.params, client.params):
            # What the client sent waits for the check's and the SET's replies
            # (parameters_applied, check_failed, parameters_failed).
            client._blocked = True
            server.prepare_for(client, check)
            return
        self._send_outbox(client, server)

    def parameters_applied(self, server: ServerConnection, client: ClientConnection) -> None:
        """The check and SET sent at link time succeeded: the client's requests go now."""
        client._blocked = False
        client.check_failures = 0
        self._send_outbox(client, server)
        if not client._blocked:
            client.carry_on()  # what it sent meanwhile

    def check_failed(self, server: ServerConnection, client: ClientConnection | None,
                     why: str) -> None:
        """server_check_query failed or the server died under it: the server goes, and the
        client (none of whose requests were sent) asks for another."""
        log.warning("%r: server_check_query failed: %s", server, why)
        server.pool.stats.count_error("server_check_failed")
        if client is not None and server.client is client:
            server.client = None
            client.server = None
            client._blocked = False
            client.on(ClientEvent.RELEASED)
            server.close(f"server_check_query failed: {why}")
            client.check_failures += 1
            if client.check_failures >= CHECK_ATTEMPTS:
                # Every server fails it: say so rather than open servers without end.
                client.fail(PoolerError(f"server_check_query failed: {why}"))
                return
            asked = client.link_time
            self.request_server(client)
            if client.state is ClientState.WAITING:
                # Still the same wait: query_wait_timeout counts from the first ask.
                client.wait_start = min(client.wait_start, asked)
        else:
            server.close(f"server_check_query failed: {why}")

    def parameters_failed(self, server: ServerConnection, client: ClientConnection,
                          fields: dict[str, str]) -> None:
        """The SET sent at link time failed: none of the client's requests ran; they would
        have run under settings it did not ask for. As PgBouncer, the client is dropped with
        the reason, and the server is closed."""
        text = fields.get("M", "")
        log.warning("%r: could not set the client's session parameters on %r: %s", client,
                    server, text)
        client.fail(PoolerError(f"could not set session parameters on the server: {text}",
                                fields.get("C") or errors.PROTOCOL_VIOLATION))
        server.close("session parameters could not be set")

    def _send_outbox(self, client: ClientConnection, server: ServerConnection) -> None:
        data = client.take_outbox(server)
        if data:
            if pipeline.worth_extending(server):
                # Sends data, then the waiting clients' behind it, or lists the server as
                # one whose line has room.
                pipeline.extend(self, server, data)
                return
            server.send(data)

    def flush_soon(self, server: ServerConnection) -> None:
        """Have `server.flush()` called at the end of this round of the event loop (its
        callbacks run once every connection with something ready has been read)."""
        if not self._to_flush:
            self.loop.call_soon(self._flush_servers)
        self._to_flush.append(server)

    def _flush_servers(self) -> None:
        servers, self._to_flush = self._to_flush, []
        for server in servers:
            try:
                server.flush()
            except Exception:  # noqa: BLE001 - one broken socket must not strand the others
                log.exception("%r: writing deferred requests failed", server)
                server.close("write failed")

    def pipeline(self, server: ServerConnection) -> None:
        """The linked client has sent a whole transaction: if it ends at its Sync, queue
        waiting clients behind it (net/pipeline.py)."""
        if pipeline.worth_extending(server):
            pipeline.extend(self, server)

    def release(self, client: ClientConnection, now: float = 0.0) -> None:
        """The client's transaction ended and nothing is owed: its server goes back."""
        server = client.server
        assert server is not None and client.pool is not None
        now = now or self.now()
        stats = client.pool.stats
        stats.xact_count += 1
        held = now - client.link_time
        stats.xact_time_us += int(held * 1e6)
        stats.xact_histogram.observe(held)
        client.server = None
        server.client = None
        if server._reading_paused:
            server.resume_reading()
        if client.state is ClientState.CLOSED:  # it left while queued in a pipeline
            if server.chain:
                pipeline.hand_on(self, server, now)
            elif server.statements.detach():
                self._reset_always(server)
                self.server_available(server)
            else:
                server.close("prepared-statement replies out of step")
            return
        if client._reading_paused:
            client.resume_reading()
        client.on(ClientEvent.RELEASED)
        if server.chain:
            pipeline.hand_on(self, server, now)
        elif server.statements.detach():
            self._reset_always(server)
            self.server_available(server)
        else:
            # Never expected: a request of the client's still waits for its reply, which
            # the next client would get. Do not hand the server on.
            log.error("%r: prepared-statement requests still queued at release", server)
            server.close("prepared-statement replies out of step")
        if client.close_after_release:
            client.fail(PoolerError("pooler is shutting down", errors.ADMIN_SHUTDOWN))
        elif client._blocked:
            client.resume_rewriting()  # what it sent meanwhile goes to its next server

    def _reset_always(self, server: ServerConnection) -> None:
        """server_reset_query_always: the reset query after every transaction, in every
        pool mode (its replies are hidden; the next client's requests queue behind it)."""
        cfg = self.settings.pooler
        if cfg.server_reset_query_always and cfg.server_reset_query:
            server.send_hidden_query(cfg.server_reset_query)

    def server_available(self, server: ServerConnection) -> None:
        """A server with no client: hand it to the first waiting client, or keep it idle."""
        pool = server.pool
        if server.cancels_in_flight:
            pool.park_canceled(server)  # _send_cancel brings it back
            return
        pool.being_canceled.discard(server)
        now = self.now()
        lifetime = self.settings.pooler.server_lifetime
        if pool.paused or pool.close_needed or pool.removed or (
            lifetime and now - server.connect_time > lifetime
            and server.state is not ServerState.LOGIN
        ):
            reason = self._close_reason(server, now)
            if reason:
                server.close(reason)
                return
        if server.state is not ServerState.IDLE:
            server.on(ServerEvent.FREED)
        server.request_time = now  # free since now (server_check_delay counts from here)
        if not pool.paused:
            while (client := pool.dequeue()) is not None:
                if client.state is ClientState.WAITING:
                    self.link(client, server)
                    return
        pool.put_idle(server)

    def _close_reason(self, server: ServerConnection, now: float) -> str:
        """Why a server that just became free must close instead of serving again, if so."""
        pool = server.pool
        if pool.paused:
            return "pause mode"
        if server in pool.close_needed:
            return "database configuration changed"
        if pool.removed and not pool.clients:
            return "database removed"
        lifetime = self.settings.pooler.server_lifetime
        if lifetime and now - server.connect_time > lifetime and (
            server.state is not ServerState.LOGIN
        ):
            return "server lifetime over"
        return ""

    def _serve_waiting(self, pool: Pool) -> None:
        while pool.waiting and pool.idle and not pool.paused:
            server = pool.take_idle()
            client = pool.dequeue()
            assert server is not None and client is not None
            if client.state is ClientState.WAITING:
                self.link(client, server)
            else:
                pool.put_idle(server)

    # --- cancel ---------------------------------------------------------------------------

    def forward_cancel(self, pid: int, secret: int) -> None:
        """A CancelRequest with a pooler-issued key goes to the server that client holds.

        Until PostgreSQL has taken the cancel (it closes the cancel connection once it has
        signalled the backend), the server is handed to no one else, or the cancel could hit
        the next client's query (server_available parks it in Pool.being_canceled)."""
        client = self.cancel_keys.get((pid, secret))
        if client is None or client.server is None:
            return
        server = client.server
        if server.client is not client:
            # Queued in a pipeline: any query it might hit is another client's (pipeline.py).
            log.info("%r: cancel request dropped: its query is queued behind another's", client)
            return
        if server.chain:
            # Others' queries are already on the wire behind this one: landing a moment after
            # it ends, the cancel would hit theirs. Dropped (pipelining is opt-in, and says so).
            log.info("%r: cancel request dropped: other clients' queries are queued behind it",
                     client)
            return
        server.cancels_in_flight += 1
        self._spawn(self._send_cancel(server))

    async def _send_cancel(self, server: ServerConnection) -> None:
        timeout = CANCEL_WAIT_TIMEOUT
        landed = False
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(server.host, server.port)
                try:
                    writer.write(m.cancel_request(server.backend_pid, server.backend_secret))
                    await writer.drain()
                    await reader.read()  # PostgreSQL closes it once the backend is signalled
                    landed = True
                finally:
                    writer.close()
        except (OSError, TimeoutError) as failure:
            log.warning("%r: cancel request failed: %s", server,
                        "cancel_wait_timeout" if isinstance(failure, TimeoutError) else failure)
        server.cancels_in_flight -= 1
        if server.cancels_in_flight or server.state is ServerState.CLOSED:
            return
        if not landed:
            # It may still land, on whoever has the server by then: never hand it on.
            self.close_server(server, "cancel request did not complete")
        elif server in server.pool.being_canceled:
            self.server_available(server)

    # --- the janitor ----------------------------------------------------------------------

    async def _janitor_loop(self) -> None:
        while True:
            await asyncio.sleep(JANITOR_PERIOD)
            try:
                self.janitor()
            except Exception:  # noqa: BLE001 - the janitor must outlive any one bug
                log.exception("janitor failed")

    def janitor(self) -> None:
        """Enforce the timeouts and keep the pools at their sizes."""
        cfg = self.settings.pooler
        now = self.now()
        if cfg.client_login_timeout:
            for client in list(self.login_clients):
                if now - client.connect_time > cfg.client_login_timeout:
                    client.fail(PoolerError("client_login_timeout"))
        for pool in list(self.pools.values()):
            if cfg.query_wait_timeout:
                while pool.waiting and (
                    now - pool.waiting[0].wait_start > cfg.query_wait_timeout
                ):
                    pool.stats.count_error("query_wait_timeout")
                    pool.waiting[0].fail(PoolerError("query_wait_timeout"))
                # Clients at login waiting for the pool's first server wait for a server too.
                for client in list(pool.awaiting_params):
                    if now - client.state_since > cfg.query_wait_timeout:
                        pool.stats.count_error("query_wait_timeout")
                        client.fail(PoolerError("query_wait_timeout"))
            if cfg.query_wait_notify:
                # PgBouncer 1.25: tell a client queued this long why its query has not run.
                for client in pool.waiting:
                    if now - client.wait_start <= cfg.query_wait_notify:
                        break  # the queue is in arrival order
                    if not client.wait_notified and client.state is ClientState.WAITING:
                        client.wait_notified = True
                        client.write(m.notice_response(WAIT_NOTICE))
            user_entry = self.settings.users.get(pool.user)
            xact_timeout = (user_entry and user_entry.transaction_timeout) or (
                cfg.transaction_timeout)
            for server in list(pool.active):
                client = server.client
                if client is None:
                    continue
                if not client.ledger.idle():
                    if cfg.query_timeout and now - client.query_start > cfg.query_timeout:
                        server.close("query timeout")
                        pool.stats.count_error("query_timeout")
                        client.fail(PoolerError("query timeout"))
                elif (
                    cfg.idle_transaction_timeout
                    and client.tx_status != m.TX_IDLE
                    and now - client.state_since > cfg.idle_transaction_timeout
                ):
                    server.close("idle transaction timeout")
                    pool.stats.count_error("idle_transaction_timeout")
                    client.fail(PoolerError("idle transaction timeout"))
                if client.state is ClientState.CLOSED:
                    continue
                if xact_timeout and now - client.xact_start > xact_timeout and (
                    not client.ledger.idle() or client.tx_status != m.TX_IDLE
                ):
                    server.close("transaction timeout")
                    pool.stats.count_error("transaction_timeout")
                    client.fail(PoolerError("transaction timeout"))
            keep = pool.limits.min_pool_size
            for server in list(pool.idle):
                if len(pool.idle) + len(pool.active) <= keep:
                    break
                idle_for = now - server.request_time
                if (cfg.server_idle_timeout and idle_for > cfg.server_idle_timeout) or (
                    cfg.server_lifetime and now - server.connect_time > cfg.server_lifetime
                ):
                    # Through the one close path: out of the idle stack at once, so it is
                    # never handed out while closing, and the count above sees it gone.
                    self.close_server(server, "server idle timeout"
                                      if idle_for > cfg.server_idle_timeout
                                      else "server lifetime over")
            if pool.removed and not pool.clients:
                self._drop_removed(pool)
                continue
            self.launch_servers(pool)
        if cfg.client_idle_timeout:
            for client in list(self.clients):
                if client.state is ClientState.IDLE and (
                    now - client.state_since > cfg.client_idle_timeout
                ):
                    if client.pool is not None:
                        client.pool.stats.count_error("client_idle_timeout")
                    client.fail(PoolerError("client_idle_timeout"))

    def _drop_removed(self, pool: Pool) -> None:
        """A pool of a removed database whose last client left: close it down, forget it."""
        for server in list(pool.idle):
            self.close_server(server, "database removed")
        if pool.server_count == 0:
            del self.pools[(pool.database, pool.user)]
            if not any(p.database == pool.database for p in self.pools.values()):
                self.retired.pop(pool.database, None)

    # --- the stats period -----------------------------------------------------------------

    async def _stats_loop(self) -> None:
        """Every stats_period: snapshot the counters (SHOW STATS averages) and log the
        "stats:" line, as PgBouncer does."""
        while True:
            await asyncio.sleep(max(0.1, self.settings.pooler.stats_period))
            averages = self.stats_periods.refresh(list(self.pools.values()), self.now())
            if self.settings.pooler.log_stats:
                log.info("%s", stats_line(averages))


def carry_back_pressure(client: ClientConnection, server: ServerConnection) -> None:
    """A new link inherits the pauses its two sides are in: a client still above its write
    high-water mark gets a server whose reading is paused, and the other way round."""
    if client.writing_paused:
        server.pause_reading()
    if server.writing_paused:
        client.pause_reading()


def _server_side(entry: DatabaseEntry) -> tuple[object, ...]:
    """The parts of a [databases] entry that shape a server connection (not the sizes)."""
    return (entry.host, entry.port, entry.server_dbname, entry.user, entry.password,
            entry.auth_user, entry.application_name, entry.client_encoding, entry.datestyle,
            entry.timezone, entry.connect_query)
