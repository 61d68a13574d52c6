"""The systems under test: pypool and PgBouncer started from one pgbouncer.ini, and direct
PostgreSQL as the physical reference.

Both poolers get the same ini. pypool's copy differs only where it must: ``workers = N``
for ``--workers``, and ``max_prepared_statements`` when the PgBouncer in use is too old to
accept that key. Each run starts a fresh pooler process and stops it afterwards; the ini
is written just before the start with a port that is free at that moment, as other
programs on the machine may take a port while no pooler holds it.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pg_cluster
import pgwire
import procstats

REPO = Path(__file__).resolve().parent.parent
DEFAULT_POOL_SIZE = 20
MAX_PREPARED_STATEMENTS = 200
# The auth_files make_targets writes in the run's directory: the role's SCRAM secret as
# PostgreSQL stores it (every scenario but one), and its password in plain text.
USERLIST = "userlist.txt"
PLAIN_USERLIST = "userlist-plain.txt"
PORT_RANGE = (15000, 32000)  # below the kernel's ephemeral ports (32768 and up)


def free_port() -> int:
    """A random port in PORT_RANGE that 127.0.0.1 can bind right now."""
    for _ in range(200):
        port = random.randrange(*PORT_RANGE)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit(f"no free port found in {PORT_RANGE}")


class PoolerError(Exception):
    """A pooler did not start or did not answer a login and ``SELECT 1``."""


@dataclass
class Target:
    """One system a scenario is run against, as named in the results."""

    name: str
    kind: str  # "pypool", "pgbouncer", "relay" (bench/relay.py), "floor" (pool_floor.py), "direct"
    port: int  # a pooler's is chosen anew at each start
    ini: Path | None = None
    settings: dict[str, object] = field(default_factory=dict)  # the ini's [pgbouncer] section
    command: list[str] = field(default_factory=list)
    popen_kwargs: dict = field(default_factory=dict)
    logfile: Path | None = None
    unavailable: str = ""  # why the harness skips it, once it failed to start
    process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, cluster: pg_cluster.Cluster, timeout: float = 30.0,
              overrides: dict[str, object] | None = None) -> None:
        """Start the pooler and wait until a login and ``SELECT 1`` through it succeed.
        `overrides`: ini keys of this start only (a scenario's auth_file).

        A failed start is tried once more on another port before it counts.
        """
        if self.kind == "direct":
            return
        try:
            self._start(cluster, timeout, overrides or {})
        except PoolerError:
            self._start(cluster, timeout, overrides or {})

    def _start(self, cluster: pg_cluster.Cluster, timeout: float,
               overrides: dict[str, object]) -> None:
        assert self.ini is not None and self.logfile is not None
        self.port = free_port()
        self.ini.write_text(
            ini_text(dict(self.settings, listen_port=self.port, **overrides), cluster))
        with open(self.logfile, "a") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} {' '.join(self.command)}\n")
            log.flush()
            try:
                self.process = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group, so workers stop with it
                    **self.popen_kwargs,
                )
            except OSError as error:
                raise PoolerError(f"{self.name} could not be started: {error}") from error
        deadline = time.monotonic() + timeout
        last_error = "no answer"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.process = None
                tail = self.log_tail()
                last = tail.splitlines()[-1].removeprefix("    | ") if tail else ""
                raise PoolerError(f"{self.name} exited at start-up: {last}\n{tail}")
            try:
                asyncio.run(
                    asyncio.wait_for(
                        pgwire.run_sql(
                            "127.0.0.1",
                            self.port,
                            cluster.user,
                            cluster.password,
                            cluster.dbname,
                            "SELECT 1",
                        ),
                        timeout=3,
                    )
                )
                return
            except (OSError, EOFError, TimeoutError, pgwire.PgError) as error:
                last_error = repr(error)
            time.sleep(0.2)
        self.stop()
        raise PoolerError(f"{self.name} not ready after {timeout:.0f} s: {last_error}")

    def stop(self) -> None:
        """SIGTERM the pooler's process group, SIGKILL it if it lingers."""
        if self.process is None:
            return
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(grace)
                break
            except subprocess.TimeoutExpired:
                continue
        self.process = None

    def alive(self) -> bool:
        return self.kind == "direct" or (self.process is not None and self.process.poll() is None)

    def cpu_seconds(self) -> float | None:
        return procstats.cpu_seconds(self.pid) if self.pid else None

    def rss_bytes(self) -> int | None:
        return procstats.rss_bytes(self.pid) if self.pid else None

    def log_tail(self, lines: int = 15) -> str:
        if not self.logfile or not self.logfile.exists():
            return ""
        text = self.logfile.read_text(errors="replace")
        tail = [line for line in text.splitlines() if line.strip()][-lines:]
        return "\n".join(f"    | {line}" for line in tail)


def ini_text(settings: dict[str, object], cluster: pg_cluster.Cluster) -> str:
    databases = f"{cluster.dbname} = host=127.0.0.1 port={cluster.port} dbname={cluster.dbname}"
    body = "\n".join(f"{key} = {value}" for key, value in settings.items())
    return f"[databases]\n{databases}\n\n[pgbouncer]\n{body}\n"


def tls_settings(workdir: Path) -> dict[str, object]:
    """Client-side TLS for both poolers, from one self-signed certificate made here:
    `allow`, so the plaintext scenarios (PGSSLMODE=disable) run as before and the tls-*
    ones (PGSSLMODE=require) get TLS from the same certificate and key."""
    key, cert = workdir / "bench-tls.key", workdir / "bench-tls.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    key.chmod(0o600)
    if os.geteuid() == 0:  # PgBouncer runs as postgres and must read them
        for path in (key, cert):
            shutil.chown(path, "postgres", "postgres")
    return {"client_tls_sslmode": "allow", "client_tls_key_file": key,
            "client_tls_cert_file": cert}


def _bench_script(name: str, script: str, settings: dict[str, object], workdir: Path,
                  *args: str) -> Target:
    """A reference target that is one of bench/'s scripts, run with the poolers' ini."""
    ini = workdir / f"{name}.ini"
    return Target(name, name, 0, ini=ini, settings=settings,
                  command=[sys.executable, str(REPO / "bench" / script), str(ini), *args],
                  popen_kwargs=dict(cwd=REPO / "bench"), logfile=workdir / f"{name}.log")


def make_targets(
    names: list[str],
    workers: list[int],
    pipeline_depths: list[int],
    cluster: pg_cluster.Cluster,
    workdir: Path,
    pgbouncer_binary: Path,
    pgbouncer_has_prepared: bool,
) -> list[Target]:
    """Write the auth_file and return the targets in the order they are to alternate."""
    userlist = workdir / USERLIST
    for path, secret in ((userlist, cluster.scram_secret()),
                         (workdir / PLAIN_USERLIST, cluster.password)):
        path.write_text(f'"{cluster.user}" "{secret}"\n')
        path.chmod(0o600)
        if os.geteuid() == 0:  # PgBouncer refuses to run as root and runs as postgres
            shutil.chown(path, "postgres", "postgres")
    settings: dict[str, object] = {
        "listen_addr": "127.0.0.1",
        "unix_socket_dir": "",
        "auth_type": "scram-sha-256",
        "auth_file": userlist,
        "admin_users": cluster.user,
        "pool_mode": "transaction",
        "default_pool_size": DEFAULT_POOL_SIZE,
        "max_client_conn": 12000,
        "log_connections": 0,
        "log_disconnections": 0,
    }
    if pgbouncer_has_prepared:
        settings["max_prepared_statements"] = MAX_PREPARED_STATEMENTS
    settings.update(tls_settings(workdir))

    targets = []
    for name in names:
        if name == "direct":
            targets.append(Target("direct", "direct", cluster.port))
        elif name == "relay":
            # The floor for pooler CPU: a no-op uvloop relay, one PostgreSQL connection per
            # client (relay.py).
            targets.append(_bench_script("relay", "relay.py", settings, workdir))
        elif name == "floor":
            # The floor for TPS: pools as the poolers do, and does nothing else (pool_floor.py).
            targets.append(_bench_script("floor", "pool_floor.py", settings, workdir,
                                         str(workdir / PLAIN_USERLIST)))
        elif name == "pgbouncer":
            ini = workdir / "pgbouncer.ini"
            targets.append(
                Target(
                    "pgbouncer",
                    "pgbouncer",
                    0,
                    ini=ini,
                    settings=settings,
                    command=[str(pgbouncer_binary), str(ini)],
                    popen_kwargs=dict(cwd=workdir, **pg_cluster.owner_kwargs()),
                    logfile=workdir / "pgbouncer.log",
                )
            )
        else:
            # pipeline_depth is in every pypool label (pd0: pypool's default, PgBouncer's
            # guarantees; pd4: the opt-in that trades them for throughput), so results of
            # the two modes are never confused.
            for count, depth in [(c, d) for c in workers or [None] for d in pipeline_depths]:
                variant = "pypool" if count is None else f"pypool-w{count}"
                variant += f"-pd{depth}"
                extra = dict(settings, max_prepared_statements=MAX_PREPARED_STATEMENTS,
                             pipeline_depth=depth)
                if count is not None:
                    extra["workers"] = count
                ini = workdir / f"{variant}.ini"
                env = dict(os.environ, PYTHONPATH=str(REPO))
                targets.append(
                    Target(
                        variant,
                        "pypool",
                        0,
                        ini=ini,
                        settings=extra,
                        command=[sys.executable, "-m", "pypool", str(ini)],
                        popen_kwargs=dict(cwd=REPO, env=env),
                        logfile=workdir / f"{variant}.log",
                    )
                )
    return targets
