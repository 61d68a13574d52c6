"""The process as PgBouncer's init scripts and test suite drive it: --quiet keeps the
logfile, -d detaches and writes the pidfile, a live pidfile stops a second start, a stale one
is removed, -R is refused with a message, and --version is SHOW VERSION's line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres, free_port
from tests.conftest import APP_PASSWORD, APP_USER, REPO_ROOT
from tests.integration.app_client import connect
from tests.integration.polling import wait_for

pytestmark = pytest.mark.timeout(60)


def pypool(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "pypool", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def write_ini(tmp_path: Path, postgres: EmbeddedPostgres, **keys: str) -> tuple[Path, int]:
    port = free_port()
    userlist = tmp_path / "userlist.txt"
    userlist.write_text(f'"{APP_USER}" "{APP_PASSWORD}"\n')
    lines = [f"{k} = {v}" for k, v in {"listen_port": str(port), "auth_type": "scram-sha-256",
                                       "auth_file": str(userlist),
                                       "unix_socket_dir": str(tmp_path), **keys}.items()]
    ini = tmp_path / "pgbouncer.ini"
    ini.write_text(f"[databases]\napp = host={postgres.host} port={postgres.port} dbname=app\n"
                   "[pgbouncer]\n" + "\n".join(lines) + "\n")
    return ini, port


def dsn(port: int) -> str:
    return f"postgresql://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{port}/app"


def serves(port: int) -> bool:
    try:
        with connect(dsn(port)) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.OperationalError:
        return False


def _serve_once(ini: Path, port: int, *flags: str) -> tuple[bytes, bytes]:
    """Run pypool in the foreground until a client is served, SIGQUIT it; its stdout and
    stderr (it must have exited 0)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "pypool", *flags, str(ini)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: serves(port), 15)
    finally:
        proc.send_signal(signal.SIGQUIT)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    return out, err


def test_quiet_silences_stderr_but_not_the_logfile(
    postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    log = tmp_path / "pypool.log"
    ini, port = write_ini(tmp_path, postgres, logfile=str(log))
    out, err = _serve_once(ini, port, "--quiet")
    assert out == b"" and err == b""
    text = log.read_text()
    assert "login attempt: db=app user=app" in text  # INFO lines are kept
    assert "new connection to server (from 127.0.0.1:" in text


def test_daemon_detaches_writes_the_pidfile_and_quit_removes_it(
    postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pypool.pid"
    ini, port = write_ini(tmp_path, postgres, pidfile=str(pidfile),
                          logfile=str(tmp_path / "pypool.log"))
    done = pypool("-d", str(ini))
    assert done.returncode == 0, done.stderr
    assert wait_for(pidfile.exists, 10)
    pid = int(pidfile.read_text())
    try:
        assert wait_for(lambda: serves(port), 15)
        assert os.getsid(pid) != os.getsid(0)  # a session of its own, away from ours
        # A second start sees the live pid and refuses before binding anything.
        again = pypool(str(ini))
        assert again.returncode == 1
        assert f"pidfile '{pidfile}' exists, another instance running?" in again.stderr
    finally:
        os.kill(pid, signal.SIGQUIT)
    assert wait_for(lambda: not pidfile.exists(), 10)
    assert wait_for(lambda: not Path(f"/proc/{pid}").exists(), 10)


def test_daemon_needs_a_pidfile(postgres: EmbeddedPostgres, tmp_path: Path) -> None:
    ini, _ = write_ini(tmp_path, postgres)
    done = pypool("--daemon", str(ini))
    assert done.returncode == 1
    assert "daemon needs pidfile configured" in done.stderr


def test_a_stale_pidfile_is_removed(postgres: EmbeddedPostgres, tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    pidfile = tmp_path / "pypool.pid"
    pidfile.write_text(f"{dead.pid}\n")
    ini, port = write_ini(tmp_path, postgres, pidfile=str(pidfile))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "pypool", str(ini)], env=env,
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: serves(port), 15)
        assert int(pidfile.read_text()) == proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert b"stale pidfile, removing" in err
    assert not pidfile.exists()


def test_reboot_with_nothing_to_take_over(postgres: EmbeddedPostgres, tmp_path: Path) -> None:
    ini, port = write_ini(tmp_path, postgres)
    done = pypool("-R", str(ini))
    assert done.returncode == 1
    assert "--reboot: no pypool to take over" in done.stderr, done.stderr
    time.sleep(0.2)
    assert not serves(port)


def test_version_is_the_console_version_line(postgres: EmbeddedPostgres,
                                             tmp_path: Path) -> None:
    printed = pypool("-V").stdout.strip()
    assert printed.startswith("PgBouncer 1.24.1 (pypool ")
    ini, port = write_ini(tmp_path, postgres, admin_users=APP_USER)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "pypool", "-q", str(ini)], env=env,
                            stdin=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: serves(port), 15)
        with connect(f"postgresql://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{port}/pgbouncer") as c:
            assert c.execute("SHOW VERSION").fetchone() == (printed,)
    finally:
        proc.send_signal(signal.SIGQUIT)
        proc.wait(10)


@pytest.mark.timeout(90)
def test_the_quick_start_says_its_port_is_taken_and_prints_no_url() -> None:
    """With the port held by another process, the quick start must not print a
    DATABASE_URL (it would point at that process): it says the port is taken, and how to
    choose another."""
    port = free_port()
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        done = pypool("--port", str(port), timeout=60)
    assert done.returncode == 1, done
    assert "DATABASE_URL" not in done.stdout
    assert f"port {port} is taken" in done.stderr
    assert "--port" in done.stderr


def test_without_quiet_the_log_goes_to_stderr_as_well_as_the_logfile(
    postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    log = tmp_path / "pypool.log"
    ini, port = write_ini(tmp_path, postgres, logfile=str(log))
    _, err = _serve_once(ini, port)
    assert b"login attempt: db=app user=app" in err
    assert "login attempt: db=app user=app" in log.read_text()


def test_a_daemon_that_cannot_listen_fails_its_start(
    postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    """The starter waits for the detached process's verdict: a taken port is exit 1 with
    the reason, not exit 0 and a daemon that is gone."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    taken = holder.getsockname()[1]
    pidfile = tmp_path / "pypool.pid"
    ini, _ = write_ini(tmp_path, postgres, pidfile=str(pidfile), listen_port=str(taken),
                       listen_addr="127.0.0.1", logfile=str(tmp_path / "pypool.log"))
    try:
        done = pypool("-d", str(ini))
    finally:
        holder.close()
    assert done.returncode == 1
    assert f"port {taken} is taken" in done.stderr
    assert not pidfile.exists()


def test_a_daemon_with_an_unwritable_logfile_fails_its_start(
    postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pypool.pid"
    ini, _ = write_ini(tmp_path, postgres, pidfile=str(pidfile),
                       logfile=str(tmp_path / "no-such-folder" / "pypool.log"))
    done = pypool("-d", str(ini))
    assert done.returncode == 1
    assert "cannot start:" in done.stderr and "no-such-folder" in done.stderr
    assert not pidfile.exists()


@pytest.mark.parametrize(("url", "why"), [
    ("postgresql://app:pw@db:99999/app", "invalid port '99999'"),
    ("postgresql://app:pw@db1:5432,db2:5433/app", "several hosts with different ports"),
    ("postgresql://app:pw@db/app?gssencmode=disable", "URL parameter 'gssencmode'"),
])
def test_a_database_url_that_cannot_be_honoured_is_one_line_not_a_traceback(
        url: str, why: str) -> None:
    done = pypool(url)
    assert done.returncode == 2
    assert why in done.stderr and "Traceback" not in done.stderr


def test_a_refused_ini_is_logged_in_the_logfile_it_names(
    postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    """As PgBouncer 1.25 (its suite's test_auth_dbname_usage_global_setting): the start
    stops, and the logfile says why, not only stderr."""
    log = tmp_path / "pypool.log"
    ini, _ = write_ini(tmp_path, postgres, logfile=str(log), auth_dbname="pgbouncer")
    done = pypool("--quiet", str(ini))
    assert done.returncode == 2
    line = 'cannot use the reserved "pgbouncer" database as an auth_dbname'
    assert line in done.stderr
    assert log.read_text().count(line) == 1
