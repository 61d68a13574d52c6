"""Fixtures shared by the whole suite.

- `postgres` (session): a real PostgreSQL cluster (pypool.embedded) with database `app`
  owned by role `app` (password `app-secret`), superuser role `pool_admin` (password
  `admin-secret`), and database `bench` (owned by `app`) initialised by
  `pgbench -i -s 1`.
- `pooler` (function): a factory that writes a PgBouncer-format pgbouncer.ini and
  userlist.txt and runs `python -m pypool <ini>` as a subprocess; returns `Pooler`.
- `pg_activity`: `server_connections(postgres, dbname, usename)`, the number of server
  backends a database/user pair has right now, as PostgreSQL itself sees them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres, free_port

REPO_ROOT = Path(__file__).resolve().parent.parent

APP_USER, APP_PASSWORD = "app", "app-secret"
ADMIN_USER, ADMIN_PASSWORD = "pool_admin", "admin-secret"

POOLER_START_TIMEOUT = 10.0
POOLER_STOP_TIMEOUT = 10.0


# -- the real server ------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres()
    try:
        pg.start()
        pg.create_role(APP_USER, APP_PASSWORD)
        pg.create_role(ADMIN_USER, ADMIN_PASSWORD, superuser=True)
        pg.execute(f"CREATE DATABASE app OWNER {APP_USER}")
        pg.execute(f"CREATE DATABASE bench OWNER {APP_USER}")
        # Initialised as `app`, so the tables belong to the user tests connect as.
        subprocess.run(
            [
                pg.tool("pgbench"),
                "-i",
                "-s",
                "1",
                "-q",
                "-h",
                pg.host,
                "-p",
                str(pg.port),
                "-U",
                APP_USER,
                "bench",
            ],
            env={**os.environ, "PGPASSWORD": APP_PASSWORD},
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
        yield pg
    finally:
        pg.stop()


def server_connections(
    postgres: EmbeddedPostgres, dbname: str = "app", usename: str = "app"
) -> int:
    """Client backends connected to `dbname` as `usename`, not counting the one asking."""
    rows = postgres.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = %s AND usename = %s AND backend_type = 'client backend'"
        " AND pid <> pg_backend_pid()",
        params=(dbname, usename),
    )
    assert rows is not None
    return int(rows[0][0])


@pytest.fixture
def pg_activity() -> Callable[..., int]:
    """`server_connections` itself: call it as `pg_activity(postgres, "app", "app")`."""
    return server_connections


# -- the pooler under test ------------------------------------------------------------


@pytest.fixture
def app_table(postgres: EmbeddedPostgres) -> Iterator[str]:
    """A fresh table `(x int)` in db app, owned by role app; dropped afterwards."""
    name = f"t_{time.monotonic_ns()}"
    with psycopg.connect(postgres.dsn("app", APP_USER, APP_PASSWORD), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (x int)")
    yield name
    with psycopg.connect(postgres.dsn("app", APP_USER, APP_PASSWORD), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")


def rss_mib(pid: int) -> float:
    """The resident memory of process `pid` (a pooler's), in MiB, as the kernel counts it."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def rows_in(postgres: EmbeddedPostgres, table: str) -> int:
    """How many rows `table` in db app holds, read directly from PostgreSQL."""
    rows = postgres.execute(f"SELECT count(*) FROM {table}", dbname="app")
    assert rows is not None
    return int(rows[0][0])


def _quote_userlist(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


@dataclass
class Pooler:
    """A running `python -m pypool` and the files it was started from."""

    host: str
    port: int
    proc: subprocess.Popen[bytes]
    ini_path: Path
    userlist_path: Path
    log_path: Path
    # what the ini was rendered from, so rewrite_config() can change one part of it
    settings: dict[str, str] = field(repr=False)
    databases: dict[str, str] = field(repr=False)
    userlist: dict[str, str] = field(repr=False)
    extra_sections: str = field(default="", repr=False)

    def log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def dsn(self, dbname: str = "app", user: str = APP_USER, password: str = APP_PASSWORD) -> str:
        quote = urllib.parse.quote
        return (
            f"postgresql://{quote(user, safe='')}:{quote(password, safe='')}"
            f"@{self.host}:{self.port}/{quote(dbname, safe='')}"
        )

    def reload(self) -> None:
        """SIGHUP: re-read the ini (call rewrite_config() first to change it)."""
        self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> int:
        """SIGTERM, up to 10 s to exit, then SIGKILL. Returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(POOLER_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def rewrite_config(
        self,
        ini_overrides: Mapping[str, str | None] | None = None,
        databases: Mapping[str, str] | None = None,
        userlist: Mapping[str, str] | None = None,
        extra_sections: str | None = None,
    ) -> None:
        """Rewrite the ini/userlist in place (same port); `ini_overrides` merge, the rest
        replace. Takes effect on reload()."""
        self.settings = _apply_overrides(self.settings, ini_overrides)
        if databases is not None:
            self.databases = dict(databases)
        if userlist is not None:
            self.userlist = dict(userlist)
        if extra_sections is not None:
            self.extra_sections = extra_sections
        _write_config(
            self.ini_path,
            self.userlist_path,
            self.settings,
            self.databases,
            self.userlist,
            self.extra_sections,
        )


def _apply_overrides(
    settings: Mapping[str, str], overrides: Mapping[str, str | None] | None
) -> dict[str, str]:
    merged = dict(settings)
    for key, value in (overrides or {}).items():
        if value is None:
            merged.pop(key, None)  # None removes a default key
        else:
            merged[key] = value
    return merged


def _write_config(
    ini_path: Path,
    userlist_path: Path,
    settings: Mapping[str, str],
    databases: Mapping[str, str],
    userlist: Mapping[str, str],
    extra_sections: str,
) -> None:
    """pgbouncer.ini ([databases], [pgbouncer], then extra_sections verbatim) and
    userlist.txt (`"user" "secret"` lines)."""
    lines = ["[databases]"]
    lines += [f"{name} = {connstr}" for name, connstr in databases.items()]
    lines += ["", "[pgbouncer]"]
    lines += [f"{key} = {value}" for key, value in settings.items()]
    text = "\n".join(lines) + "\n"
    if extra_sections:
        text += "\n" + extra_sections.strip("\n") + "\n"
    ini_path.write_text(text, encoding="utf-8")
    userlist_path.write_text(
        "".join(f"{_quote_userlist(u)} {_quote_userlist(s)}\n" for u, s in userlist.items()),
        encoding="utf-8",
    )


def _wait_until_listening(p: Pooler) -> None:
    deadline = time.monotonic() + POOLER_START_TIMEOUT
    while True:
        if p.proc.poll() is not None:
            pytest.fail(
                f"pypool exited with status {p.proc.returncode} before listening on "
                f"{p.host}:{p.port}\n--- {p.log_path} ---\n{p.log()}",
                pytrace=False,
            )
        try:
            with socket.create_connection((p.host, p.port), timeout=0.2):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            p.stop()
            pytest.fail(
                f"pypool did not listen on {p.host}:{p.port} within "
                f"{POOLER_START_TIMEOUT:.0f} s\n--- {p.log_path} ---\n{p.log()}",
                pytrace=False,
            )
        time.sleep(0.05)


PoolerFactory = Callable[..., Pooler]


@pytest.fixture
def pooler(postgres: EmbeddedPostgres, tmp_path: Path) -> Iterator[PoolerFactory]:
    """A factory: `pooler(ini_overrides=None, databases=None, userlist=None,
    extra_sections="")` starts a pypool and returns a `Pooler` once it accepts TCP.

    `ini_overrides` merge into `[pgbouncer]` (a value of None drops a default key);
    `databases` and `userlist` replace the defaults when given. Each pooler gets its
    own folder `tmp_path/pooler-<n>/` with pgbouncer.ini, userlist.txt and pypool.log, and
    its unix socket `.s.PGSQL.<port>` (unix_socket_dir).
    Every pooler started is stopped at teardown.
    """
    started: list[Pooler] = []

    def start(
        ini_overrides: Mapping[str, str | None] | None = None,
        databases: Mapping[str, str] | None = None,
        userlist: Mapping[str, str] | None = None,
        extra_sections: str = "",
    ) -> Pooler:
        workdir = tmp_path / f"pooler-{len(started) + 1}"
        workdir.mkdir()
        # Not a port the overrides name (a test's metrics_port, from free_port() too: both
        # free now, the same number can come up twice).
        named = {str(value) for key, value in (ini_overrides or {}).items()
                 if key.endswith("_port") and value}
        port = free_port()
        while (port == postgres.port or any(p.port == port for p in started)
               or str(port) in named):
            port = free_port()
        userlist_path = workdir / "userlist.txt"
        server = f"host={postgres.host} port={postgres.port}"
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(port),
            "auth_type": "scram-sha-256",
            "auth_file": str(userlist_path),
            "pool_mode": "transaction",
            "default_pool_size": "5",
            "max_client_conn": "500",
            "admin_users": ADMIN_USER,
            # its own folder, not /tmp: poolers on random ports would leave sockets there
            "unix_socket_dir": str(workdir),
        }
        ini_path = workdir / "pgbouncer.ini"
        log_path = workdir / "pypool.log"
        settings = _apply_overrides(settings, ini_overrides)
        port = int(settings.get("listen_port", port))  # an override wins
        db_entries = (
            dict(databases)
            if databases is not None
            else {
                "app": f"{server} dbname=app",
                "bench": f"{server} dbname=bench",
                "postgres": f"{server} dbname=postgres",
            }
        )
        users = (
            dict(userlist)
            if userlist is not None
            else {
                APP_USER: APP_PASSWORD,
                ADMIN_USER: ADMIN_PASSWORD,
                postgres.superuser: postgres.password,
            }
        )
        _write_config(ini_path, userlist_path, settings, db_entries, users, extra_sections)
        env = dict(os.environ)
        # run this checkout's pypool even when it is not pip-installed
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
        )
        env["PYTHONUNBUFFERED"] = "1"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pypool", str(ini_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env,
            )
        p = Pooler(
            host="127.0.0.1",
            port=port,
            proc=proc,
            ini_path=ini_path,
            userlist_path=userlist_path,
            log_path=log_path,
            settings=settings,
            databases=db_entries,
            userlist=users,
            extra_sections=extra_sections,
        )
        started.append(p)
        _wait_until_listening(p)
        return p

    yield start

    for p in started:
        p.stop()
    for p in started:
        # Whatever a test did, the client's ledger and the server's statement queue must
        # never have disagreed (pooler/transactions.py logs it when they do).
        assert "disagree (" not in p.log(), f"--- {p.log_path} ---\n{p.log()}"
