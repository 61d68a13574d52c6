"""transaction_log against a real PostgreSQL: each line's fields checked one by one against
what the client did and what PostgreSQL says (pg_backend_pid, SQLSTATEs)."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.admin.console_client import console, show
from tests.conftest import APP_USER, PoolerFactory
from tests.integration.app_client import connect
from tests.integration.polling import wait_for

pytestmark = pytest.mark.timeout(40)


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def lines_of(path: Path, app: str, count: int) -> list[dict[str, Any]]:
    """The first `count` lines of application `app`, once the writer has written them."""
    assert wait_for(lambda: len([r for r in read_log(path)
                                 if r["application_name"] == app]) >= count, 10), (
        read_log(path))
    return [r for r in read_log(path) if r["application_name"] == app][:count]


def waiting(admin: psycopg.Connection[Any], database: str = "app") -> int:
    """cl_waiting of the pools of `database` (SHOW POOLS)."""
    return sum(r["cl_waiting"] for r in show(admin, "POOLS") if r["database"] == database)


def test_each_field_of_each_outcome(pooler: PoolerFactory, tmp_path: Path) -> None:
    path = tmp_path / "tx.jsonl"
    p = pooler({"transaction_log": str(path), "default_pool_size": "1",
                "query_wait_timeout": "1"})
    app = "txlog-fields"
    with connect(p.dsn() + f"?application_name={app}") as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # 1: commit
        with conn.transaction():  # 2: BEGIN, SELECT, COMMIT
            conn.execute("SELECT 1")
        conn.execute("BEGIN")  # 3: BEGIN, ROLLBACK
        conn.execute("ROLLBACK")
        with pytest.raises(psycopg.errors.DivisionByZero):  # 4: error
            conn.execute("SELECT 1/0")
        timer = threading.Timer(0.3, conn.cancel)  # 5: cancelled
        timer.start()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(5)")
        timer.join()
        # 6: a wait that times out while this connection holds the only server
        conn.execute("BEGIN")
        with pytest.raises(psycopg.OperationalError, match="query_wait_timeout"), \
                connect(p.dsn() + f"?application_name={app}-waiter") as waiter:
            waiter.execute("SELECT 1")
        conn.execute("COMMIT")  # 6: BEGIN, COMMIT, around the other's wait
        client_ids = {r["client_id"] for r in lines_of(path, app, 6)}
    # 8: a client that leaves in the middle of its transaction
    gone = connect(p.dsn() + f"?application_name={app}-gone")
    gone.execute("BEGIN")
    gone.execute("SELECT 1")
    gone.close()

    lines = lines_of(path, app, 6)
    outcomes = [(r["outcome"], r["sqlstate"], r["statements"]) for r in lines]
    assert outcomes == [
        ("commit", None, 1), ("commit", None, 3), ("rollback", None, 2),
        ("error", "22012", 1), ("cancelled", "57014", 1), ("commit", None, 2),
    ]
    assert len(client_ids) == 1
    for r in lines:
        assert r["kind"] == "transaction"
        assert r["user"] == APP_USER and r["database"] == "app"
        assert r["backend_pid"] == pid  # pool_size 1: the same PostgreSQL backend each time
        assert isinstance(r["server_id"], int)
        assert r["bytes_in"] > 0 and r["bytes_out"] > 0
        assert r["arrival_us"] <= r["assigned_us"] <= r["released_us"]
        assert r["wait_us"] == r["assigned_us"] - r["arrival_us"]
        assert r["xact_us"] == r["released_us"] - r["assigned_us"]
        for key in ("arrival", "assigned", "released"):
            wall = datetime.fromisoformat(r[key]).timestamp()
            assert abs(wall - time.time()) < 60
        assert r["queue_on_arrival"] == 0
        assert r["queue_policy"] == "fifo" and r["server_policy"] == "lifo"
    assert lines[4]["xact_us"] >= 250_000  # the cancelled pg_sleep ran ~0.3 s
    assert lines[5]["xact_us"] >= 1_000_000  # held while the other waited it out
    [waited] = lines_of(path, f"{app}-waiter", 1)
    assert waited["kind"] == "wait" and waited["outcome"] == "query_wait_timeout"
    assert waited["assigned"] is None and waited["server_id"] is None
    assert 1_000_000 <= waited["wait_us"] < 4_000_000
    assert waited["client_id"] not in client_ids
    [left] = lines_of(path, f"{app}-gone", 1)
    assert left["outcome"] == "client_gone" and left["statements"] == 2
    assert left["backend_pid"] == pid


def test_queue_length_on_arrival_and_wait(pooler: PoolerFactory, tmp_path: Path) -> None:
    path = tmp_path / "tx.jsonl"
    p = pooler({"transaction_log": str(path), "default_pool_size": "1"})
    app = "txlog-queue"
    holder = connect(p.dsn() + f"?application_name={app}-holder")
    holder.execute("BEGIN")
    waiters = [connect(p.dsn() + f"?application_name={app}") for _ in range(3)]
    threads = []
    for conn in waiters:
        thread = threading.Thread(target=conn.execute, args=("SELECT 1",))
        thread.start()
        threads.append(thread)
        with console(p) as admin:  # each one queued before the next arrives
            assert wait_for(lambda: waiting(admin) == len(threads), 5)
    time.sleep(0.2)
    holder.execute("COMMIT")
    for thread in threads:
        thread.join(10)
    lines = lines_of(path, app, 3)
    assert sorted(r["queue_on_arrival"] for r in lines) == [0, 1, 2]
    assert all(r["wait_us"] >= 200_000 for r in lines)
    for conn in [holder, *waiters]:
        conn.close()


def test_turned_on_by_reload_and_reopened_on_sighup(pooler: PoolerFactory,
                                                    tmp_path: Path) -> None:
    path = tmp_path / "tx.jsonl"
    p = pooler()
    app = "txlog-reload"
    with connect(p.dsn() + f"?application_name={app}") as conn:
        conn.execute("SELECT 1")
        p.rewrite_config({"transaction_log": str(path)})
        p.reload()
        assert wait_for(lambda: "transaction_log: writing to" in p.log(), 5), p.log()
        conn.execute("SELECT 2")  # a client connected before: logged too
        assert len(lines_of(path, app, 1)) == 1
        rotated = tmp_path / "tx.jsonl.1"
        path.rename(rotated)
        p.reload()
        time.sleep(0.3)
        conn.execute("SELECT 3")
        assert wait_for(lambda: len(read_log(path)) == 1, 10)
        assert len(read_log(rotated)) == 1
        with console(p) as admin:
            state = {r["key"]: r["value"] for r in show(admin, "STATE")}
            config = {r["key"]: r["value"] for r in show(admin, "CONFIG")}
        assert state["transaction_log_written"] == "2"
        assert state["transaction_log_dropped"] == "0"
        assert config["transaction_log"] == str(path)
        assert config["queue_policy"] == "fifo" and config["server_policy"] == "lifo"
