"""Online restart (`pypool -R`, pooler/takeover.py): a new process takes over the running
one's sockets and idle clients; the clients carry on with their prepared statements, their
settings and their cancel keys, and never notice."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres
from pypool.pooler.takeover import recv_frame, send_frame, takeover_address
from tests.conftest import ADMIN_PASSWORD, ADMIN_USER, REPO_ROOT
from tests.integration.app_client import connect
from tests.integration.polling import wait_for
from tests.integration.tls_ca import Certificates, certs, tls_settings  # noqa: F401

pytestmark = pytest.mark.timeout(60)


def _start_reboot(ini: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "pypool", "-R", str(ini)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=ini.parent, env=env)


@pytest.fixture
def rebooted() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes a test started with -R, stopped at teardown."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _backend_pid(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])


def _sleeping(postgres: EmbeddedPostgres, conn: psycopg.Connection[Any], marker: str
              ) -> tuple[threading.Thread, dict[str, BaseException]]:
    """`conn` runs a long pg_sleep in a thread, running in PostgreSQL when this returns; the
    dict gets its error."""
    result: dict[str, BaseException] = {}

    def sleep() -> None:
        try:
            conn.execute(f"SELECT pg_sleep(15) /* {marker} */")
        except psycopg.Error as exc:
            result["error"] = exc

    thread = threading.Thread(target=sleep, daemon=True)
    thread.start()
    assert wait_for(lambda: postgres.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND state = 'active'"
        " AND pid <> pg_backend_pid()", params=(f"%{marker}%",)
    )[0][0] == 1, 5)  # type: ignore[index]
    return thread, result


def test_online_restart_keeps_idle_clients(postgres: EmbeddedPostgres, pooler: Any,
                                           rebooted: list[subprocess.Popen[bytes]]) -> None:
    p = pooler(ini_overrides={"max_prepared_statements": "10"})
    old_servers = set()
    with connect(p.dsn(), application_name="carried",
                 options="-c search_path=pg_catalog,public") as idle, \
            connect(p.dsn()) as busy:
        startup_path = idle.execute("SHOW search_path").fetchone()
        assert idle.execute("SELECT %s::int + 1", [1], prepare=True).fetchone() == (2,)
        idle.execute("PREPARE by_sql AS SELECT 42")
        idle.execute("SET TimeZone = 'Asia/Tokyo'")  # a setting that follows its client
        old_servers.add(_backend_pid(idle))
        busy.execute("BEGIN")
        old_servers.add(_backend_pid(busy))  # inside a transaction when the restart begins
        new_log = p.ini_path.parent / "rebooted.log"
        proc = _start_reboot(p.ini_path, new_log)
        rebooted.append(proc)
        assert wait_for(lambda: "takes over" in p.log(), 10), p.log()
        time.sleep(0.3)
        # Sent while the old process holds it paused: read and answered by the new one.
        during: dict[str, object] = {}

        def query_during() -> None:
            try:
                during["row"] = idle.execute("SELECT 'sent during the handover'").fetchone()
            except psycopg.Error as exc:
                during["error"] = exc

        asked = threading.Thread(target=query_during, daemon=True)
        asked.start()
        time.sleep(0.3)
        assert asked.is_alive(), during  # not answered by the old process
        busy.execute("COMMIT")  # its transaction ends: it is passed on too
        assert p.proc.wait(15) == 0, p.log()
        assert proc.poll() is None, new_log.read_text()
        assert "takeover: 2 clients passed" in p.log(), p.log()
        assert wait_for(lambda: "takeover: 2 clients adopted" in new_log.read_text(), 5), \
            new_log.read_text()
        asked.join(5)
        assert during == {"row": ("sent during the handover",)}, during
        # Both carry on in the new process, on servers of its own.
        assert idle.execute("SELECT %s::int + 1", [5], prepare=True).fetchone() == (6,)
        assert idle.execute("EXECUTE by_sql").fetchone() == (42,)
        assert idle.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)
        assert idle.execute("SHOW application_name").fetchone() == ("carried",)
        assert idle.execute("SHOW search_path").fetchone() == startup_path
        idle.execute("SET search_path = public")
        idle.execute("RESET search_path")  # back to its startup value, carried over too
        assert idle.execute("SHOW search_path").fetchone() == startup_path
        assert _backend_pid(idle) not in old_servers
        assert busy.execute("SELECT 7").fetchone() == (7,)
        # Its cancel key (the one it got at login) is still its own: a cancel reaches its
        # query and no other's.
        thread, result = _sleeping(postgres, idle, "cancel-after-takeover")
        idle.cancel_safe(timeout=5)
        thread.join(5)
        assert isinstance(result.get("error"), psycopg.errors.QueryCanceled), result
        assert busy.execute("SELECT 8").fetchone() == (8,)
    # New clients, over TCP and the unix socket, reach the new process.
    with connect(p.dsn()) as fresh:
        assert fresh.execute("SELECT 1").fetchone() == (1,)
    with connect(p.dsn(), host=str(p.ini_path.parent)) as over_unix:
        assert over_unix.execute("SELECT 2").fetchone() == (2,)
    # And it can be taken over in its turn.
    again = _start_reboot(p.ini_path, p.ini_path.parent / "again.log")
    rebooted.append(again)
    assert proc.wait(15) == 0, new_log.read_text()
    assert wait_for(lambda: "listening" in (p.ini_path.parent / "again.log").read_text(), 5)
    with connect(p.dsn()) as third:
        assert third.execute("SELECT 3").fetchone() == (3,)


def test_online_restart_with_nothing_to_take_over(pooler: Any, tmp_path: Path) -> None:
    p = pooler()
    p.stop()
    proc = _start_reboot(p.ini_path, tmp_path / "alone.log")
    assert proc.wait(20) == 1
    text = (tmp_path / "alone.log").read_text()
    assert "no pypool to take over" in text, text
    assert ".takeover" in text


def test_a_transaction_still_open_at_suspend_timeout_is_not_passed(
        pooler: Any, rebooted: list[subprocess.Popen[bytes]]) -> None:
    p = pooler(ini_overrides={"suspend_timeout": "1"})
    with connect(p.dsn()) as stuck, connect(p.dsn()) as idle:
        stuck.execute("BEGIN")
        stuck.execute("SELECT 1")
        assert idle.execute("SELECT 1").fetchone() == (1,)
        new_log = p.ini_path.parent / "rebooted.log"
        proc = _start_reboot(p.ini_path, new_log)
        rebooted.append(proc)
        assert p.proc.wait(15) == 0, p.log()
        assert "1 clients still busy after suspend_timeout" in p.log(), p.log()
        assert "takeover: 1 clients passed" in p.log(), p.log()
        with pytest.raises(psycopg.OperationalError, match="server shutting down"):
            stuck.execute("SELECT 2")
        assert wait_for(lambda: "takeover: 1 clients adopted" in new_log.read_text(), 5), \
            new_log.read_text()
        assert idle.execute("SELECT 3").fetchone() == (3,)


def test_a_client_running_transactions_back_to_back_is_passed(
        pooler: Any, rebooted: list[subprocess.Popen[bytes]]) -> None:
    """A client that never rests (its next transaction follows each ReadyForQuery at once)
    is passed: it sees no error and, without a reconnect, its transactions go on once the
    old process has exited, in the new one. (That it is paused at the release of its server,
    not found idle by luck, is tests/pooler/test_linking.py's to show.)"""
    p = pooler(ini_overrides={"suspend_timeout": "3"})
    stop = threading.Event()
    done: list[int] = []  # a 1 per committed transaction
    failed: list[BaseException] = []

    def busy(conn: psycopg.Connection[Any]) -> None:
        try:
            while not stop.is_set():
                with conn.transaction():
                    conn.execute("SELECT 1")
                done.append(1)
        except psycopg.Error as exc:
            failed.append(exc)

    with connect(p.dsn()) as conn:
        worker = threading.Thread(target=busy, args=(conn,), daemon=True)
        worker.start()
        assert wait_for(lambda: len(done) > 50, 5)
        new_log = p.ini_path.parent / "rebooted.log"
        rebooted.append(_start_reboot(p.ini_path, new_log))
        assert p.proc.wait(15) == 0, p.log()
        assert "still busy" not in p.log(), p.log()
        assert "takeover: 1 clients passed" in p.log(), p.log()
        before = len(done)
        assert wait_for(lambda: len(done) > before + 50, 5), (failed, new_log.read_text())
        stop.set()
        worker.join(5)
    assert failed == []
    assert "takeover: 1 clients adopted" in new_log.read_text(), new_log.read_text()


def test_a_new_process_that_fails_to_start_changes_nothing(
        pooler: Any, rebooted: list[subprocess.Popen[bytes]]) -> None:
    """The old process stops listening only once the new one says it serves: one that takes
    the sockets and dies leaves the old one serving, its clients untouched."""
    p = pooler()
    with connect(p.dsn()) as before:
        assert before.execute("SELECT 1").fetchone() == (1,)
        address = takeover_address(str(p.ini_path.parent), p.port)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as fake:
            fake.settimeout(5)
            fake.connect(address)
            send_frame(fake, {"pid": os.getpid()})
            reply, fds = recv_frame(fake)
            assert "tcp" in reply["listeners"] and "unix" in reply["listeners"]
            for fd in fds:
                os.close(fd)
        # It went away without saying it serves.
        assert wait_for(lambda: "takeover failed, serving on as before" in p.log(), 5), p.log()
        assert before.execute("SELECT 2").fetchone() == (2,)
        with connect(p.dsn()) as fresh:
            assert fresh.execute("SELECT 3").fetchone() == (3,)
        # A real takeover afterwards goes through.
        proc = _start_reboot(p.ini_path, p.ini_path.parent / "rebooted.log")
        rebooted.append(proc)
        assert p.proc.wait(15) == 0, p.log()
        assert before.execute("SELECT 4").fetchone() == (4,)


def test_tls_and_console_sessions_are_told_and_plaintext_ones_passed(
        pooler: Any, certs: Certificates,  # noqa: F811 - the fixture
        rebooted: list[subprocess.Popen[bytes]]) -> None:
    """A TLS connection's keys live in the old process and a console session belongs to it:
    both are told `server shutting down` (not passed half-way); the plaintext client beside
    them goes on in the new process."""
    p = pooler(ini_overrides=tls_settings(certs, "allow"))
    with connect(p.dsn(), sslmode="require") as secure, \
            connect(p.dsn(), sslmode="disable") as plain, \
            connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
        assert secure.pgconn.ssl_in_use and not plain.pgconn.ssl_in_use
        assert secure.execute("SELECT 1").fetchone() == (1,)
        assert plain.execute("SELECT 1").fetchone() == (1,)
        assert admin.execute("SHOW VERSION").fetchone() is not None
        proc = _start_reboot(p.ini_path, p.ini_path.parent / "rebooted.log")
        rebooted.append(proc)
        assert p.proc.wait(15) == 0, p.log()
        assert "takeover: 1 clients passed" in p.log(), p.log()
        for gone in (secure, admin):
            with pytest.raises(psycopg.OperationalError, match="server shutting down"):
                gone.execute("SELECT 1")
        assert plain.execute("SELECT 2").fetchone() == (2,)
    with connect(p.dsn(), sslmode="require") as again:  # the new process does TLS itself
        assert again.pgconn.ssl_in_use
        assert again.execute("SELECT 3").fetchone() == (3,)


def test_a_cancel_during_the_handover_reaches_the_old_process(
        postgres: EmbeddedPostgres, pooler: Any,
        rebooted: list[subprocess.Popen[bytes]]) -> None:
    """The new process accepts as soon as it has the sockets, so a CancelRequest for a query
    still running in the old one reaches the new one: it is passed back, and lands."""
    p = pooler(ini_overrides={"suspend_timeout": "20"})
    with connect(p.dsn()) as slow:
        thread, result = _sleeping(postgres, slow, "during-handover")
        new_log = p.ini_path.parent / "rebooted.log"
        proc = _start_reboot(p.ini_path, new_log)
        rebooted.append(proc)
        assert wait_for(lambda: "listening" in new_log.read_text(), 10), new_log.read_text()
        time.sleep(0.5)  # the new process has said it serves: the old one accepts no more
        start = time.monotonic()
        slow.cancel_safe(timeout=5)  # a new connection: to the new process
        thread.join(5)
        assert isinstance(result.get("error"), psycopg.errors.QueryCanceled), result
        assert time.monotonic() - start < 3
        # The client, idle now, is passed; the old process exits well before suspend_timeout.
        assert p.proc.wait(10) == 0, p.log()
        assert "takeover: 1 clients passed" in p.log(), p.log()
        assert slow.execute("SELECT 'after'").fetchone() == ("after",)
