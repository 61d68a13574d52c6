"""The pooler's life as the operator steers it: start, reload, pause, reconnect, stop.

`start` claims the unix socket, opens the metrics endpoint and the TCP listeners, starts the
janitor and the stats period, opens the min_pool_size servers and writes the pidfile.
`reread` and `apply_settings` switch to a new configuration (RELOAD, SIGHUP, SET) without
dropping anyone; `pause_all`, `set_paused` and `tag_dirty` are PAUSE, RESUME and RECONNECT;
`shutdown` drains transactions (SIGINT: `drain` ends each client at its transaction
boundary) or clients (SIGTERM) before `exit_now`.
`install_signals` maps the signals onto these, as PgBouncer's.

It sets the operator's switches on the Pooler (shutting_down, paused_all, the retired
databases) and changes pools only through the pooler's own paths: close_server,
launch_servers, linking.serve_waiting. Short of an exit, it must never drop a connected
client, nor close a busy server under its client: a reload, a PAUSE or a RECONNECT closes
idle servers now and busy ones once released.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from typing import TYPE_CHECKING

from .. import compiled
from ..core.link import LinkEvent, LinkState
from ..net.client import ClientConnection
from ..net.socket_options import tune_listeners
from ..net.unix_socket import open_unix_socket
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..settings import RESTART_ONLY_KEYS, SettingsError, load_ini, worker_share
from . import janitor, linking, research, takeover, tracing

if TYPE_CHECKING:
    from ..pooling.pool import Pool
    from ..settings import DatabaseEntry, Settings
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool")


async def start(pooler: Pooler) -> None:
    cfg = pooler.settings.pooler
    research.apply(pooler, None)  # the transaction log, before any client
    tracing.apply(pooler, None)  # trace = on
    taken = pooler.taken  # -R: the sockets of the process taken over (pooler/takeover.py)
    if taken is not None and taken.unix is not None:
        pooler.unix_socket = takeover.claim_unix_socket(pooler.settings, taken.unix)
        pooler.unix_listener = await pooler.loop.create_unix_server(
            lambda: ClientConnection(pooler), sock=pooler.unix_socket.sock,
            backlog=cfg.listen_backlog,
        )
    elif cfg.unix_socket_dir:
        # First, as PgBouncer checks: a pooler already serving this port's socket stops us
        # before anything is bound. With workers = N the parent has claimed it and each
        # worker serves the same socket (cli.run_workers).
        if pooler.unix_socket is None:
            pooler.unix_socket = open_unix_socket(cfg.unix_socket_dir, cfg.listen_port,
                                                  cfg.unix_socket_mode, cfg.unix_socket_group)
        pooler.unix_listener = await pooler.loop.create_unix_server(
            lambda: ClientConnection(pooler), sock=pooler.unix_socket.sock,
            backlog=cfg.listen_backlog,
        )
    if cfg.metrics_port and pooler.serve_metrics is not None and taken is None:
        # First: up before clients (after a takeover, once the old process has let it go).
        pooler.metrics_servers = await pooler.serve_metrics(
            cfg.metrics_addr or cfg.listen_addr, cfg.metrics_port
        )
    # "*" is every address: None to create_server. (One list, typed for that: compiled,
    # a list[str] holding None raises TypeError.)
    hosts: list[str | None] = [
        None if h.strip() == "*" else h.strip() for h in cfg.listen_addr.split(",")
        if h.strip()
    ]
    if taken is not None:
        hosts = []  # listening already, on the sockets passed
        for sock in taken.tcp:
            pooler.listeners.append(await pooler.loop.create_server(
                lambda: ClientConnection(pooler), sock=sock, backlog=cfg.listen_backlog))
    for host in hosts:
        server = await pooler.loop.create_server(
            lambda: ClientConnection(pooler),
            host,
            cfg.listen_port,
            reuse_port=cfg.so_reuseport or cfg.workers > 1,
            backlog=cfg.listen_backlog,
        )
        pooler.listeners.append(server)
    tune_listeners(pooler.listeners, cfg)  # the tcp_* keys, inherited by each accepted socket
    takeover.listen(pooler, taken.takeover if taken is not None else None)
    log.info("listening on %s:%d; hot path: %s", cfg.listen_addr, cfg.listen_port,
             compiled.status)
    if pooler.unix_socket is not None:
        log.info("listening on unix socket %s", pooler.unix_socket.path)
    pooler.janitor_task = pooler.loop.create_task(janitor.run_janitor(pooler))
    pooler.spawn(janitor.run_stats_period(pooler))
    for pool_key in _min_pool_keys(pooler):
        pooler.pool_for(*pool_key)
    _pidfile(pooler)


def _pidfile(pooler: Pooler) -> None:
    if pooler.settings.pooler.pidfile:
        with open(pooler.settings.pooler.pidfile, "w") as fh:
            fh.write(f"{os.getpid()}\n")


def _min_pool_keys(pooler: Pooler) -> list[tuple[str, str]]:
    keys = []
    for name, entry in pooler.settings.databases.items():
        min_size = entry.min_pool_size
        if min_size is None:
            min_size = pooler.settings.pooler.min_pool_size
        if name != "*" and entry.user and min_size > 0:
            keys.append((name, entry.user))
    return keys


def reread(pooler: Pooler) -> bool:
    """Re-read the ini and the auth_file; keep the old config if the new one is bad."""
    if not pooler.settings.path:
        pooler.load_auth()
        return True
    try:
        new = worker_share(load_ini(pooler.settings.path), pooler.settings.pooler.workers)
    except SettingsError as exc:
        log.error("reload failed, keeping the old configuration: %s", exc)
        return False
    apply_settings(pooler, new)
    log.info("configuration reloaded from %s", new.path)
    if pooler.tls.failure is not None:
        log.error("TLS configuration could not be reloaded, keeping old configuration")
        return False
    return True


def apply_settings(pooler: Pooler, new: Settings) -> None:
    """Switch to `new` (RELOAD, SIGHUP, SET) without dropping anyone.

    Sizes and timeouts apply to the next assignment. A database whose connection details
    changed gets its servers replaced as they are released. A database gone from the
    config refuses new clients; its connected clients keep being served until they leave.
    Keys that only apply at start keep their old values.
    """
    old = pooler.settings
    kept = {}
    for key in RESTART_ONLY_KEYS:
        if getattr(new.pooler, key) != getattr(old.pooler, key):
            log.warning("%s changed: takes effect at restart", key)
            kept[key] = getattr(old.pooler, key)
    if kept:
        new = dataclasses.replace(new, pooler=dataclasses.replace(new.pooler, **kept))
    pooler.use_settings(new)
    if new.pooler.verbose != old.pooler.verbose:  # SET verbose, or a reload changing it
        logging.getLogger().setLevel(logging.DEBUG if new.pooler.verbose else logging.INFO)
    pooler.load_auth()
    tune_listeners(pooler.listeners, new.pooler)  # for the clients accepted from now on
    if old.pooler.tcp_socket_buffer and not new.pooler.tcp_socket_buffer:
        log.warning("tcp_socket_buffer = 0 takes effect at restart: the listening sockets "
                    "keep the size set before (a socket given a size is no longer autotuned)")
    if pooler.tls.reload(new.pooler):
        # New servers get the new TLS settings; old ones must not keep weaker ones. A login
        # failure cached under the old settings says nothing about the new ones.
        for pool in list(pooler.pools.values()):
            pool.login_error = None
            tag_dirty(pooler, pool, "obsolete connection (server TLS configuration changed)")
    _resize_statement_caches(pooler, old.pooler.max_prepared_statements)
    research.apply(pooler, old.pooler)  # policies; the transaction log reopened (rotation)
    tracing.apply(pooler, old.pooler)
    for pool in list(pooler.pools.values()):
        entry = new.database(pool.database)
        old_entry = old.database(pool.database) or pooler.retired.get(pool.database)
        if entry is None:
            if not pool.removed and old_entry is not None:
                log.warning("database %s removed from the config: new clients refused, "
                            "%d connected clients carry on", pool.database, len(pool.clients))
                pooler.retired[pool.database] = old_entry
            pool.removed = True
            pool.limits = dataclasses.replace(pool.limits, min_pool_size=0)
            continue
        if pool.removed:
            pool.removed = False
            pooler.retired.pop(pool.database, None)
        pool.limits = pooler.limits_for(entry, pool.user)
        if old_entry is not None and _server_side(old_entry) != _server_side(entry):
            tag_dirty(pooler, pool, "database configuration changed")
        surplus = pool.server_count - pool.limits.pool_size - pool.limits.reserve_pool_size
        for server in pool.idle[:max(0, surplus)]:
            pooler.close_server(server, "pool_size lowered")
        pooler.launch_servers(pool)
        linking.serve_waiting(pooler, pool)
    # A database added with a forced user and min_pool_size gets its pool now, as at start.
    for pool_key in _min_pool_keys(pooler):
        pooler.pool_for(*pool_key)


def _resize_statement_caches(pooler: Pooler, old_cap: int) -> None:
    """A new max_prepared_statements applies to every server's cache at once, as in
    PgBouncer: it is enforced at the next statement each server prepares (so lowering it
    closes nothing until then). 0 turns rewriting off for clients that connect later; the
    clients already in keep theirs, so the servers keep the old cap for them."""
    cap = pooler.settings.pooler.max_prepared_statements
    if cap == old_cap or cap == 0:
        return
    for pool in pooler.pools.values():
        for server in (*pool.idle, *pool.active, *pool.login, *pool.being_canceled):
            server.statements.cache.cap = cap


# PgBouncer's log lines for the signals, which scripts and its test suite grep.
_SHUTDOWN_LINES = {
    "SIGINT": "got SIGINT, shutting down, waiting for all servers connections to be released",
    "SIGTERM": "got SIGTERM, shutting down, waiting for all clients disconnect",
    "DRAIN": "draining: each client ends at its next transaction boundary",
}


def shutdown(pooler: Pooler, how: str) -> None:
    """SIGINT (SHUTDOWN WAIT_FOR_SERVERS), PgBouncer's: stop accepting, let transactions
    finish; a client that asks for a server after that, or is queued for one, is told
    "server shutting down"; exit once no client holds a server. DRAIN (SHUTDOWN DRAIN, or
    SIGINT with shutdown_drain = 1): the same, and each client is ended at its transaction
    boundary (`drain`). SIGTERM (WAIT_FOR_CLIENTS): let clients finish. Again: exit now."""
    if pooler.shutting_down or how == "now":
        if pooler.shutting_down and how != "now":
            log.info("got %s while shutting down, fast exit", how)
        elif how == "now":
            log.info("got SIGQUIT, fast exit")
        exit_now(pooler)
        return
    if how == "SIGINT" and pooler.settings.pooler.shutdown_drain:
        log.info("%s", _SHUTDOWN_LINES[how])
        how = "DRAIN"
    log.info("%s", _SHUTDOWN_LINES.get(how, f"{how}: shutting down"))
    draining = how == "DRAIN"
    if draining:
        how = "SIGINT"  # what the shutdown waits for, and what new requests are told
    pooler.shutting_down = how
    # The TCP listeners close; the unix socket stays until the exit, as PgBouncer keeps it:
    # a client there is told the pooler is shutting down rather than refused.
    for listener in pooler.listeners:
        listener.close()
    if pooler.settings.pooler.shutdown_timeout:
        pooler.loop.call_later(pooler.settings.pooler.shutdown_timeout, exit_now, pooler)
    if draining:
        drain(pooler)
    elif how == "SIGINT":
        # Queued clients are told by the janitor's next sweep, idle ones when they ask for a
        # server (linking.request_server) or at the exit.
        for client in list(pooler.clients):
            if client.link.linked():
                client.on_link(LinkEvent.SHUTDOWN)
    maybe_exit(pooler)


def drain(pooler: Pooler) -> None:
    """End every pooled client at its transaction boundary (SHUTDOWN DRAIN, or SIGINT with
    shutdown_drain = 1): one between transactions now, one inside a transaction once it
    ends (its link's DRAIN marks it last and draining: it is released and closed there).
    Each is told
    `server shutting down`, SQLSTATE 57P01 admin_shutdown, what PostgreSQL itself says
    when a backend is shut down: drivers and their pools take it as "this connection is
    gone, open another" (docs/operating.md, Draining). Console sessions and clients still
    logging in stay (a login reaching its end is refused; the console is how the drain is
    watched)."""
    replication = pooler.replication.pipes
    for client in list(pooler.clients):
        if client.admin is not None or client in pooler.login_clients:
            continue
        if not client.link.linked():
            client.fail(errors.shutting_down())  # idle, or queued for a server
            continue
        client.on_link(LinkEvent.DRAIN)
        if (client.link.state is LinkState.ACTIVE and client.ledger.idle()
                and client.tx_status == m.TX_IDLE and client not in replication):
            # Linked between transactions: session mode, or pinned by its session state.
            client.fail(errors.shutting_down())


def maybe_exit(pooler: Pooler) -> None:
    """Exit once what the shutdown waits for is over: no client holding a server (SIGINT),
    no client at all (SIGTERM). Console sessions do not hold it up: they are how it was
    asked for."""
    how = pooler.shutting_down
    if not how:
        return
    if how == "SIGINT":
        if any(c.admin is None and c.server is not None for c in pooler.clients):
            return
        for client in list(pooler.clients):
            if client.admin is None:
                client.fail(errors.shutting_down())
        exit_now(pooler)
    elif all(client.admin is not None for client in pooler.clients):
        exit_now(pooler)


def exit_now(pooler: Pooler) -> None:
    """Close every connection and listener, remove the pidfile and the unix socket, let
    `stopped` resolve."""
    for client in list(pooler.clients):
        client.close("pooler exit")
    for pool in pooler.pools.values():
        for server in (list(pool.idle) + list(pool.active) + list(pool.login)
                       + list(pool.being_canceled)):
            server.close("pooler exit")
    for metrics_server in pooler.metrics_servers:
        metrics_server.close()
    if pooler.unix_listener is not None:
        pooler.unix_listener.close()
    if pooler.unix_socket is not None:
        pooler.unix_socket.remove()  # not in a forked worker: its parent removes it
    takeover.close(pooler, unlink=True)  # after a takeover it is the new process's: None
    pidfile = pooler.settings.pooler.pidfile
    if pidfile and not pooler.stopped.done() and _pidfile_is_ours(pidfile):
        try:
            os.unlink(pidfile)
        except OSError:
            pass
    research.close(pooler)  # after the clients: their last lines are in
    if not pooler.stopped.done():
        pooler.stopped.set_result(None)


def _pidfile_is_ours(path: str) -> bool:
    """Whether the pidfile holds this process's pid (after -R, the new process's is there)."""
    try:
        with open(path) as fh:
            return fh.read(32).strip() == str(os.getpid())
    except OSError:
        return False


def install_signals(pooler: Pooler) -> None:
    loop = pooler.loop
    loop.add_signal_handler(signal.SIGHUP, pooler.reload)
    loop.add_signal_handler(signal.SIGINT, pooler.shutdown, "SIGINT")
    loop.add_signal_handler(signal.SIGTERM, pooler.shutdown, "SIGTERM")
    loop.add_signal_handler(signal.SIGQUIT, pooler.shutdown, "now")
    loop.add_signal_handler(signal.SIGUSR1, _sigusr, pooler, True)
    loop.add_signal_handler(signal.SIGUSR2, _sigusr, pooler, False)


def _sigusr(pooler: Pooler, pause: bool) -> None:
    """SIGUSR1 pauses, SIGUSR2 resumes, with PgBouncer's log lines; a resume during a
    shutdown is ignored (the shutdown has paused what it must)."""
    if pause:
        if pooler.paused_all:
            log.info("got SIGUSR1, but already paused/suspended")
            return
        log.info("got SIGUSR1, pausing all activity")
    else:
        if pooler.shutting_down:
            log.info("got SIGUSR2 while shutting down, ignoring")
            return
        log.info("got SIGUSR2, continuing from %s",
                 "SUSPEND" if pooler.suspended else "PAUSE")
        pooler.suspended = False
    pooler.pause_all(pause)


def pause_all(pooler: Pooler, paused: bool) -> None:
    """PAUSE / RESUME of every database (also SIGUSR1 / SIGUSR2)."""
    log.info("%s all databases", "pausing" if paused else "resuming")
    pooler.paused_all = paused
    for pool in pooler.pools.values():
        set_paused(pooler, pool, paused or pool.database in pooler.paused_dbs)


def set_paused(pooler: Pooler, pool: Pool, paused: bool) -> None:
    """Paused: no server is handed out, idle ones close now, busy ones once released
    (server_available), and waiting clients wait. Resumed: serve them again."""
    pool.paused = paused
    if paused:
        for server in list(pool.idle):
            pooler.close_server(server, "pause mode")
    else:
        pooler.launch_servers(pool)
        linking.serve_waiting(pooler, pool)


def tag_dirty(pooler: Pooler, pool: Pool, reason: str) -> None:
    """RECONNECT: replace every server of the pool: idle ones now, busy ones once released,
    logging-in ones once logged in (closing those now would fail the clients waiting for
    the pool's first login, and block new logins for server_login_retry)."""
    for server in pool.servers():
        server.close_needed = True
    for server in list(pool.idle):
        pooler.close_server(server, reason)
    if pooler.settings.pooler.server_fast_close and pool.limits.pool_mode == "session":
        # server_fast_close: a session between transactions is ended now, with its server,
        # rather than at its end (in transaction mode servers go back at once anyway).
        for server in list(pool.active):
            client = server.client
            if client is not None and client.ledger.idle() and client.tx_status == m.TX_IDLE:
                client.fail(PoolerError("database configuration changed"))
    pooler.launch_servers(pool)


def _server_side(entry: DatabaseEntry) -> tuple[object, ...]:
    """The parts of a [databases] entry that shape a server connection (not the sizes)."""
    return (entry.host, entry.port, entry.server_dbname, entry.user, entry.password,
            entry.auth_user, entry.application_name, entry.client_encoding, entry.datestyle,
            entry.timezone, entry.connect_query)
