"""What pypool logs: connections, disconnections with their reason, pooler errors, a stats
line every stats_period (PgBouncer's words), one event per line; logfile and pidfile."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.admin.console_client import app, wait_until
from tests.conftest import APP_USER, Pooler

pytestmark = pytest.mark.timeout(60)

STATS_LINE = re.compile(
    r"INFO stats: (\d+) xacts/s, (\d+) queries/s, \d+ client parses/s, \d+ server parses/s, "
    r"\d+ binds/s, \d+ client logins/s, in \d+ B/s, out \d+ B/s, xact \d+ us, "
    r"query \d+ us, wait \d+ us$"
)
LINE_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \d+ (DEBUG|INFO|WARNING|ERROR) ")


def _bad_login(p: Pooler) -> None:
    with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
        psycopg.connect(p.dsn(password="wrong"), connect_timeout=5)


def test_connections_disconnections_errors_and_stats(bouncer: Pooler) -> None:
    with app(bouncer) as client:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            client.execute("SELECT 1")
            time.sleep(0.01)
    _bad_login(bouncer)
    log = wait_until(lambda: "SASL authentication failed" in bouncer.log() and bouncer.log())
    assert re.search(r"C-\d+:app/app@127\.0\.0\.1:\d+: login attempt: db=app user=app", log)
    assert re.search(r"S-\d+:app/app@127\.0\.0\.1:\d+: new server connection", log)
    assert re.search(r"C-\d+:app/app@127\.0\.0\.1:\d+: closing because: client sent Terminate",
                     log)
    assert re.search(r"C-\d+:app/app@.*: pooler error: SASL authentication failed \(28P01\)", log)
    lines = log.splitlines()
    assert lines and all(LINE_START.match(line) for line in lines), "one event per line"
    stats = [m for m in map(STATS_LINE.search, lines) if m]
    assert len(stats) >= 2  # stats_period = 1
    assert any(int(m.group(1)) > 0 and int(m.group(2)) > 0 for m in stats)


def test_each_kind_can_be_turned_off(operated_pooler: Callable[..., Pooler]) -> None:
    p = operated_pooler(log_connections=0, log_disconnections=0, log_pooler_errors=0,
                        log_stats=0)
    with app(p) as client:
        client.execute("SELECT 1")
    _bad_login(p)
    time.sleep(1.2)  # more than a stats_period
    log = p.log()
    for text in ("login attempt", "new server connection", "closing because", "pooler error",
                 "stats:"):
        assert text not in log


def test_logfile_and_pidfile(operated_pooler: Callable[..., Pooler], tmp_path: Path) -> None:
    logfile, pidfile = tmp_path / "pypool-file.log", tmp_path / "pypool.pid"
    p = operated_pooler(logfile=logfile, pidfile=pidfile)
    # Written right after the listeners open: the kernel may accept the fixture's probe first.
    wait_until(pidfile.exists)
    assert pidfile.read_text().strip() == str(p.proc.pid)
    with app(p) as client:
        client.execute("SELECT 1")
    wait_until(lambda: f"user={APP_USER}" in logfile.read_text())
    assert "listening on" in logfile.read_text()
    assert "login attempt" in p.log()  # stderr too, as PgBouncer without -q
    # logrotate moves the file away: logging carries on in a new one, no signal needed
    os.rename(logfile, tmp_path / "pypool-file.log.1")
    with app(p) as client:
        client.execute("SELECT 2")
    wait_until(lambda: logfile.exists() and "login attempt" in logfile.read_text())
    assert p.stop() == 0
    assert not pidfile.exists()
