"""The unix-domain socket (COMPAT.md, "Unix sockets and the admin login"), against real pypool
processes: `<unix_socket_dir>/.s.PGSQL.<port>` and its lock file, its mode and group, the
console login of user `pgbouncer` by the pooler's own OS user, and `auth_type = peer`.

The suite runs as root, and so does the pooler: the peer's uid is the pooler's.
"""

from __future__ import annotations

import grp
import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres, free_port
from tests.conftest import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    APP_PASSWORD,
    APP_USER,
    REPO_ROOT,
    Pooler,
    PoolerFactory,
)
from tests.integration.app_client import connect
from tests.integration.polling import wait_for

pytestmark = pytest.mark.timeout(60)

OS_USER = pwd.getpwuid(os.geteuid()).pw_name
OS_USER_PASSWORD = "os-user-secret"


def socket_dir(p: Pooler) -> str:
    return p.settings["unix_socket_dir"]


def socket_file(p: Pooler) -> Path:
    return Path(socket_dir(p)) / f".s.PGSQL.{p.port}"


def over_socket(p: Pooler, dbname: str = "app", user: str = APP_USER,
                password: str | None = APP_PASSWORD) -> psycopg.Connection[Any]:
    """A client on the unix socket: libpq builds the path from host=<dir> port=<port>."""
    extra = {} if password is None else {"password": password}
    return connect("", host=socket_dir(p), port=p.port, dbname=dbname, user=user, **extra)


def show(admin: psycopg.Connection[Any], what: str) -> list[dict[str, Any]]:
    cur = admin.execute(f"SHOW {what}")
    assert cur.description is not None
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def run_pypool(ini: Path, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """`python -m pypool ini` expected to exit by itself (a start that fails)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "pypool", str(ini)], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def test_a_query_goes_through_the_pool_over_the_socket(pooler: PoolerFactory) -> None:
    p = pooler()
    assert stat.S_ISSOCK(socket_file(p).stat().st_mode)
    with over_socket(p) as conn:
        assert conn.execute("SELECT current_user, 40 + 2").fetchone() == (APP_USER, 42)
        with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
            rows = show(admin, "CLIENTS")
    mine = [r for r in rows if r["database"] == "app"]
    assert len(mine) == 1
    # As PgBouncer shows a unix client: "unix" and the listen port, at both ends.
    assert (mine[0]["addr"], mine[0]["port"]) == ("unix", p.port)
    assert (mine[0]["local_addr"], mine[0]["local_port"]) == ("unix", p.port)
    admin_row = next(r for r in rows if r["database"] == "pgbouncer")
    assert admin_row["addr"] == "127.0.0.1"


def test_lock_file_holds_the_pid_and_both_files_go_at_exit(pooler: PoolerFactory) -> None:
    p = pooler()
    lock = Path(f"{socket_file(p)}.lock")
    assert lock.read_text().splitlines()[0] == str(p.proc.pid)
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(10) == 0
    assert not socket_file(p).exists()
    assert not lock.exists()


def test_a_second_pooler_on_the_same_socket_refuses_to_start(pooler: PoolerFactory) -> None:
    p = pooler()
    done = run_pypool(p.ini_path)
    assert done.returncode == 1
    assert f"unix socket is in use, cannot continue: {socket_file(p)}" in done.stderr
    assert f"pid {p.proc.pid}" in done.stderr
    # The first one is untouched: its files stay, it serves.
    assert Path(f"{socket_file(p)}.lock").read_text().strip() == str(p.proc.pid)
    with over_socket(p) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_stale_lock_and_socket_are_replaced(pooler: PoolerFactory, tmp_path: Path) -> None:
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    port = free_port()
    path = sockets / f".s.PGSQL.{port}"
    left = socket.socket(socket.AF_UNIX)  # bound, never listening: what a crash leaves
    left.bind(str(path))
    left.close()
    Path(f"{path}.lock").write_text(f"{dead.pid}\n")
    p = pooler(ini_overrides={"unix_socket_dir": str(sockets), "listen_port": str(port)})
    assert Path(f"{path}.lock").read_text().strip() == str(p.proc.pid)
    with over_socket(p) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert "removing stale lock file" in p.log()


def test_empty_unix_socket_dir_means_no_socket(pooler: PoolerFactory) -> None:
    p = pooler(ini_overrides={"unix_socket_dir": ""})
    workdir = p.ini_path.parent
    assert not list(workdir.glob(".s.PGSQL.*"))
    with connect(p.dsn()) as conn:  # TCP as ever
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_mode_and_group_are_applied(pooler: PoolerFactory) -> None:
    group = grp.getgrnam("postgres")  # the embedded cluster's OS user has one
    p = pooler(ini_overrides={"unix_socket_mode": "0660", "unix_socket_group": "postgres"})
    info = socket_file(p).stat()
    assert stat.S_IMODE(info.st_mode) == 0o660
    assert info.st_gid == group.gr_gid
    with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
        config = {row["key"]: row["value"] for row in show(admin, "CONFIG")}
    assert config["unix_socket_mode"] == str(0o660)  # PgBouncer prints the int
    assert config["unix_socket_dir"] == socket_dir(p)


def test_a_socket_path_too_long_is_a_clear_start_error(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    ini = tmp_path / "pgbouncer.ini"
    ini.write_text(f"[databases]\n[pgbouncer]\nlisten_port = 6999\nunix_socket_dir = {deep}\n")
    done = run_pypool(ini)
    assert done.returncode == 1
    assert f"unix socket path {deep}/.s.PGSQL.6999 is" in done.stderr
    assert "longer than the 107" in done.stderr
    assert "Traceback" not in done.stderr


def test_pgbouncer_logs_into_the_console_without_password_over_the_socket(
    pooler: PoolerFactory,
) -> None:
    p = pooler()  # `pgbouncer` is neither in auth_file nor in admin_users
    with over_socket(p, "pgbouncer", "pgbouncer", password=None) as admin:
        assert admin.execute("SHOW VERSION").fetchone() is not None
        admin.execute("PAUSE app")  # an admin command: the login is an admin's
        admin.execute("RESUME app")
        rows = show(admin, "CLIENTS")
    assert [(r["user"], r["addr"]) for r in rows] == [("pgbouncer", "unix")]
    assert "pgbouncer access from unix socket" in p.log()


def test_pgbouncer_without_password_over_tcp_is_refused(pooler: PoolerFactory) -> None:
    p = pooler()
    with pytest.raises(psycopg.OperationalError):
        connect("", host=p.host, port=p.port, dbname="pgbouncer", user="pgbouncer")
    with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
        connect(p.dsn("pgbouncer", "pgbouncer", "a-guess"))
    # Over the socket, another user name is no admin: the usual login applies.
    with pytest.raises(psycopg.OperationalError):
        over_socket(p, "pgbouncer", APP_USER, password=None)


@pytest.fixture
def os_user_role(postgres: EmbeddedPostgres) -> str:
    """A PostgreSQL role named as the OS user running the tests (root), with a password."""
    exists = postgres.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", params=(OS_USER,))
    if not exists:
        postgres.create_role(OS_USER, OS_USER_PASSWORD)
    return OS_USER


def test_peer_lets_the_os_user_in_over_the_socket(
    pooler: PoolerFactory, postgres: EmbeddedPostgres, os_user_role: str
) -> None:
    p = pooler(
        ini_overrides={"auth_type": "peer"},
        userlist={APP_USER: APP_PASSWORD, os_user_role: OS_USER_PASSWORD,
                  ADMIN_USER: ADMIN_PASSWORD},
    )
    with over_socket(p, "app", os_user_role, password=None) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (os_user_role,)
    # Another user name than the peer's OS user is refused, as PgBouncer words it.
    with pytest.raises(psycopg.OperationalError, match="unix socket login rejected"):
        over_socket(p, "app", APP_USER, password=APP_PASSWORD)
    # Over TCP there is no peer to ask: refused too, as in PgBouncer.
    with pytest.raises(psycopg.OperationalError, match="unix socket login rejected"):
        connect(p.dsn("app", os_user_role, OS_USER_PASSWORD))
    assert wait_for(lambda: "unix socket login rejected" in p.log(), timeout=5)


def test_workers_share_one_socket_owned_by_the_parent(pooler: PoolerFactory) -> None:
    p = pooler(ini_overrides={"workers": "2"})
    lock = Path(f"{socket_file(p)}.lock")
    assert lock.read_text().strip() == str(p.proc.pid)  # the parent's pid
    conns = [over_socket(p) for _ in range(6)]
    try:
        for conn in conns:  # whichever worker accepted it
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        for conn in conns:
            conn.close()
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(15) == 0
    assert not socket_file(p).exists()
    assert not lock.exists()
