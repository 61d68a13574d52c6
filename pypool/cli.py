"""Command line: `pypool [CONFIG.ini | postgresql://URL]`.

With an ini file, runs from a PgBouncer-format config. With a URL (or DATABASE_URL in the
environment), pools that one database on 127.0.0.1:6432. With neither, creates a throwaway
local PostgreSQL (initdb, SCRAM on), pools it, and prints the DATABASE_URL to use.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import logging.handlers
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import quote

from . import daemon
from .daemon import StartError, check_pidfile, daemonize, switch_user
from .net.tls import Tls
from .settings import (
    Settings,
    SettingsError,
    from_url,
    load_ini,
    logfile_named_in,
    worker_share,
)

if TYPE_CHECKING:
    from .embedded import EmbeddedPostgres
    from .net.records import ClientRecord, TransactionLog, WireTrace
    from .net.unix_socket import UnixSocket
    from .observe.view import PoolerView
    from .pooler import Pooler
    from .pooler.takeover_state import Takeover

log = logging.getLogger("pypool")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="pypool",
        description="A transaction-mode PostgreSQL connection pooler, drop-in for PgBouncer.",
        epilog="Signals: SIGHUP reloads; SIGINT drains transactions and exits; SIGTERM "
        "drains clients and exits; SIGQUIT exits now; SIGUSR1 pauses, SIGUSR2 resumes.",
    )
    parser.add_argument(
        "config", nargs="?",
        help="a pgbouncer.ini-format file, or a postgresql:// URL (default: $DATABASE_URL, "
        "else a throwaway local PostgreSQL)",
    )
    parser.add_argument("-V", "--version", action="version", version=version_text())
    parser.add_argument("-p", "--port", type=int, help="listen port (overrides listen_port)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="increase verbosity (debug logging)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="run quietly: nothing on stderr (the logfile still gets it all)")
    parser.add_argument("-d", "--daemon", action="store_true",
                        help="run in the background (needs pidfile and logfile set)")
    parser.add_argument("-u", "--user", help="as root, switch to this OS user first")
    parser.add_argument("-R", "--reboot", action="store_true",
                        help="online restart: take over the running pypool's sockets and "
                        "idle clients (same ini; needs unix_socket_dir)")
    parser.add_argument("--trace", action="store_true",
                        help="trace every protocol message (as trace = on; docs/research.md)")
    parser.add_argument(
        "--embedded-dir", help="where the throwaway PostgreSQL lives (default: a temp dir)"
    )
    return parser.parse_args(argv)


def version_text() -> str:
    """`--version`: the same first line as the console's SHOW VERSION (tools compare them)."""
    from .admin.show import VERSION

    return VERSION


# PgBouncer's log line: `2026-12-02 10:00:00.123 4242 LOG message` (Python's level names).
LOG_FORMAT = "%(asctime)s.%(msecs)03d %(process)d %(levelname)s %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def setup_logging(settings: Settings, verbose: int, quiet: bool) -> None:
    """The logfile if set, and stderr unless quiet (as PgBouncer's: --quiet and -d only
    silence stderr; the logfile keeps every line at the usual level, scripts grep it)."""
    level = logging.DEBUG if verbose else logging.INFO
    handlers: list[logging.Handler] = []
    if settings.pooler.logfile:
        # Reopens the file when logrotate moves it away, so no signal is needed.
        handlers.append(logging.handlers.WatchedFileHandler(settings.pooler.logfile))
    if not quiet:
        handlers.append(logging.StreamHandler(sys.stderr))
    formatter = logging.Formatter(LOG_FORMAT, LOG_DATE_FORMAT)
    for handler in handlers:
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = handlers or [logging.NullHandler()]
    root.setLevel(level)


def build_pooler(settings: Settings) -> Pooler:
    """The one place the pooler, its admin console and its metrics endpoint are put together.

    net/ never imports the console or the metrics: the pooler calls them through the hooks
    set here (net/hooks.py). Both read it through one read-only view (observe/view.py); the
    console's commands drive it through its own methods (admin/control.py). Called on the
    running event loop, by `serve` (python -m pypool, the embedded quick start, each worker).
    """
    from .pooler import Pooler

    pooler = Pooler(settings)
    views: list[PoolerView] = []

    def view() -> PoolerView:
        # The console and the view are imported at their first use (about 1 MiB that a
        # pooler nobody administers never needs).
        if not views:
            from .observe.view import PoolerView

            views.append(PoolerView(pooler))
        return views[0]

    def open_console(client: ClientRecord) -> None:
        from .admin import console

        console.open_console(view(), pooler, client)

    async def serve_metrics(addrs: str, port: int) -> list[asyncio.AbstractServer]:
        from . import metrics  # prometheus_client is imported only with metrics_port set

        return await metrics.serve_metrics(view(), addrs, port)

    def open_txlog(path: str) -> TransactionLog:
        from .observe.txlog import TxLog

        return TxLog(path, pooler.now)

    def open_trace() -> WireTrace:
        from .observe.trace import Tracer
        from .observe.trace import WireTrace as Trace

        return Trace(Tracer(logging.getLogger("pypool.trace").info))

    pooler.open_console = open_console
    pooler.open_trace = open_trace
    pooler.serve_metrics = serve_metrics
    pooler.open_txlog = open_txlog
    return pooler


async def serve(settings: Settings, unix: UnixSocket | None = None,
                listening: Callable[[], None] | None = None,
                worker: tuple[int, int, int] | None = None,
                taken: Takeover | None = None) -> None:
    """Run one pooler until it exits. `unix`: the unix socket a `workers` parent claimed;
    `listening`: called once the pooler listens (the quick start prints its URL then);
    `worker`: (its number from 0, how many, the parent's pid) in a `workers` child;
    `taken`: with -R, the sockets passed by the process taken over (pooler/takeover.py)."""
    pooler = build_pooler(settings)
    pooler.unix_socket = unix
    pooler.taken = taken
    siblings: asyncio.AbstractServer | None = None
    try:
        if worker is not None:  # cancels for keys a sibling issued go to it (pooler/peers.py)
            from .pooler import peers

            pooler.worker_index, pooler.worker_count, pooler.worker_parent = worker
            siblings = await peers.listen_for_siblings(pooler)
        # Before the first socket listens: a SIGTERM that comes as soon as a client can
        # connect (a supervisor's, a test's) must find the handler, not the default that
        # kills the process and leaves its unix socket and lock behind. One during the
        # start-up itself shuts down what is up so far; `stopped` is then done.
        pooler.install_signals()
        await pooler.start()
        if taken is not None:  # its clients come once the old process has paused them
            from .pooler import takeover

            pooler.spawn(takeover.finish(pooler, taken))
        if listening is not None and not pooler.shutting_down:
            listening()
        # What start-up made (modules, settings, tables) lives as long as the process: out
        # of the collector's generations, no collection walks it again (each login's and
        # each idle client's objects would otherwise make the full ones walk it all).
        gc.collect()
        gc.freeze()
        await pooler.stopped
        await asyncio.sleep(0.05)  # let the closing transports flush
    finally:
        if siblings is not None:
            siblings.close()
        if pooler.unix_socket is not None:  # also after a failed start or a crash
            pooler.unix_socket.remove()


def run(settings: Settings, listening: Callable[[], None] | None = None,
        taken: Takeover | None = None) -> None:
    import uvloop

    workers = settings.pooler.workers
    if workers <= 1:
        uvloop.run(serve(settings, listening=listening, taken=taken))
        return
    if listening is not None:
        listening()
    run_workers(worker_share(settings, workers), workers)


def run_workers(share: Settings, workers: int) -> None:
    """`workers = N`: fork N processes that share the listen port through SO_REUSEPORT.

    Each worker has its own pools (its share of every size) and its own clients; the kernel
    spreads new connections between them. The parent forwards signals and waits. A
    CancelRequest may reach a worker that did not issue its key: the key names the worker
    that did, which it is passed on to (pooler/peers.py).

    A unix socket path can have one owner only. PgBouncer's so_reuseport answer is one
    unix_socket_dir per process, from one ini each; here one ini runs them all, so the
    parent claims the socket (and its lock, with its pid) before forking, every worker
    accepts on that one socket as on the shared TCP port, and the parent removes it at the
    end.
    """
    from .net.unix_socket import open_unix_socket

    cfg = share.pooler
    unix = None
    if cfg.unix_socket_dir:
        unix = open_unix_socket(cfg.unix_socket_dir, cfg.listen_port, cfg.unix_socket_mode,
                                cfg.unix_socket_group)
    try:
        _fork_workers(share, workers, unix)
    finally:
        if unix is not None:
            unix.remove()


def _fork_workers(share: Settings, workers: int, unix: UnixSocket | None) -> None:
    import uvloop

    children: list[int] = []
    parent = os.getpid()
    for index in range(workers):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                log.info("worker %d of %d started", index + 1, workers)
                uvloop.run(serve(share, unix, worker=(index, workers, parent)))
            except BaseException:  # noqa: BLE001 - a worker reports and exits, never returns
                log.exception("worker %d failed", index + 1)
                code = 1
            os._exit(code)
        children.append(pid)

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT,
                   signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    for child in children:
        while True:
            try:
                os.waitpid(child, 0)
                break
            except ChildProcessError:
                break
            except InterruptedError:
                continue


def prepare_process(args: argparse.Namespace, settings: Settings, embedded: bool) -> bool:
    """-R, -u, the pidfile and -d, in PgBouncer's order, before anything is bound. True
    when a stale pidfile was removed (logged once logging is set up)."""
    if args.reboot and embedded:
        raise StartError("-R/--reboot needs an ini file: the quick start has nothing to take "
                         "over")
    user = args.user or settings.pooler.user  # -u, else the ini's `user`
    if user:
        switch_user(user)
    pidfile = settings.pooler.pidfile
    # -R: the pid there is the process to take over, expected alive.
    stale = False if args.reboot else check_pidfile(pidfile)
    if args.daemon:
        if embedded:
            raise StartError("--daemon needs an ini file with pidfile set, not the quick start")
        daemonize(pidfile)
    return stale


def _log_refused_start(ini: str, why: str) -> None:
    """A start refused over its ini still reaches the logfile that ini names, as PgBouncer
    logs its fatal configuration errors (scripts grep the log): the same file and line
    format the running pooler would use."""
    logfile = logfile_named_in(ini)
    if not logfile:
        return
    try:
        handler = logging.handlers.WatchedFileHandler(logfile)
    except OSError:
        return  # stderr has it
    handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE_FORMAT))
    log.addHandler(handler)
    try:
        log.critical("%s", why)
    finally:
        log.removeHandler(handler)
        handler.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target = args.config or os.environ.get("DATABASE_URL")
    embedded = None
    try:
        if target and "://" in target:
            settings = from_url(target)
        elif target:
            settings = load_ini(target)
        else:
            from .embedded import EmbeddedPostgres

            embedded = EmbeddedPostgres(basedir=args.embedded_dir).start()
            settings = from_url(embedded.dsn("postgres"))
            # The socket lives and goes with the throwaway cluster, not in /tmp.
            settings = replace(settings, pooler=replace(settings.pooler,
                                                        unix_socket_dir=embedded.basedir))
        if args.port:
            settings = replace(settings, pooler=replace(settings.pooler, listen_port=args.port))
        if args.trace:
            settings = replace(settings, pooler=replace(settings.pooler, trace=True))
        Tls(settings.pooler)  # TLS that cannot be set up stops the pooler here, not later
    except SettingsError as exc:
        print(f"pypool: {exc}", file=sys.stderr)
        if target and "://" not in target:
            _log_refused_start(target, str(exc))
        return 2
    try:
        stale_pidfile = prepare_process(args, settings, embedded is not None)
    except StartError as exc:
        print(f"pypool: {exc}", file=sys.stderr)
        if embedded is not None:
            embedded.stop()
        return 1
    try:
        return _detached_part(args, settings, embedded, stale_pidfile)
    except BaseException as exc:  # noqa: BLE001 - a detached start tells its starter why
        daemon.failed(f"cannot start: {exc}")
        raise
    finally:
        daemon.failed("")  # exited before it was listening, whatever the reason


def _detached_part(args: argparse.Namespace, settings: Settings,
                   embedded: EmbeddedPostgres | None, stale_pidfile: bool) -> int:
    """Logging, the pooler and its end: what runs after -d has detached (each failure is
    told to the starter, which exits 1 with it)."""
    setup_logging(settings, args.verbose or settings.pooler.verbose, args.quiet or args.daemon)
    if stale_pidfile:
        log.info("stale pidfile, removing")
    listening: Callable[[], None] = daemon.ready
    if embedded is not None:
        user = embedded.superuser
        url = (
            f"postgresql://{quote(user, safe='')}:{quote(embedded.password, safe='')}"
            f"@127.0.0.1:{settings.pooler.listen_port}/postgres"
        )
        cluster_port = embedded.port

        def banner() -> None:
            # Only once listening: a URL printed before would point at whatever holds the
            # port when it is taken.
            print(f"throwaway PostgreSQL on 127.0.0.1:{cluster_port}; pypool on "
                  f"127.0.0.1:{settings.pooler.listen_port}", flush=True)
            print(f"DATABASE_URL={url}", flush=True)

        listening = banner
    taken = None
    if args.reboot:
        from .pooler import takeover

        try:
            taken = takeover.request(settings)
        except takeover.TakeoverError as exc:
            log.error("%s", exc)
            print(f"pypool: {exc}", file=sys.stderr)
            daemon.failed(str(exc))
            return 1
    try:
        run(settings, listening, taken)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            why = (f"cannot start: port {settings.pooler.listen_port} is taken (another "
                   "pooler or PostgreSQL?); choose another with --port, or listen_port in "
                   "the ini")
        else:
            why = f"cannot start: {exc}"
        log.error("%s", why)
        daemon.failed(why)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        if embedded is not None:
            embedded.stop()
    return 0
