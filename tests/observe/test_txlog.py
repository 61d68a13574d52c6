"""The transaction log's collector and writer, fed by hand: no pooler, no PostgreSQL.

The ServerTap is fed replies cut at every byte, so a header or a body split across reads is
covered; the writer's lines are read back from the file.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pypool.observe.txlog import TxLog, error_sqlstate
from pypool.protocol import messages as m
from tests.integration.polling import wait_for


@dataclass
class State:
    name: str


@dataclass
class FakePool:
    waiting: deque[Any] = field(default_factory=deque)


@dataclass
class FakeClient:
    id: int
    pool: FakePool | None
    state: State = field(default_factory=lambda: State("IDLE"))
    user: str = "app"
    database: str = "app"
    params: dict[str, str] = field(default_factory=lambda: {"application_name": "t"})
    link_time: float = 0.0
    server: Any = None


@dataclass
class FakeServer:
    id: int
    backend_pid: int = 4242
    hidden_syncs: int = 0
    client: Any = None
    chain: list[Any] = field(default_factory=list)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_error_sqlstate_reads_the_c_field() -> None:
    body = m.error_response("division by zero", "22012")[5:]
    assert error_sqlstate(body) == "22012"
    assert error_sqlstate(b"") == ""


def test_one_transaction_byte_by_byte(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "tx.jsonl"
    txlog = TxLog(str(path), clock)
    pool = FakePool(deque(["someone", "else"]))
    client = FakeClient(7, pool)
    server = FakeServer(3)
    txlog.client_data(client, 20)  # arrival: two wait ahead
    clock.t += 0.5
    client.state = State("ACTIVE")
    client.link_time = clock.t
    client.server, server.client = server, client
    txlog.client_data(client, 10)
    tap = txlog.tap(server)
    replies = (m.command_complete("BEGIN") + m.ready_for_query(ord("T"))
               + b"D" + (9).to_bytes(4, "big") + b"\0\0\0\0\0"
               + m.error_response("division by zero", "22012") + m.ready_for_query(ord("E"))
               + m.command_complete("ROLLBACK") + m.ready_for_query(m.TX_IDLE))
    for i in range(len(replies)):
        tap.feed(replies[i : i + 1])
    clock.t += 0.25
    txlog.released(client, server, clock.t)
    txlog.close()
    [line] = lines(path)
    assert line["kind"] == "transaction"
    assert line["client_id"] == 7 and line["server_id"] == 3 and line["backend_pid"] == 4242
    assert line["statements"] == 3
    assert line["bytes_in"] == 30 and line["bytes_out"] == len(replies)
    assert line["outcome"] == "error" and line["sqlstate"] == "22012"
    assert line["wait_us"] == 500000 and line["xact_us"] == 250000
    assert line["queue_on_arrival"] == 2
    assert line["arrival_us"] == 1000000000
    assert line["assigned_us"] - line["arrival_us"] == line["wait_us"]
    assert line["application_name"] == "t" and line["user"] == "app"
    assert line["queue_policy"] == "fifo" and line["server_policy"] == "lifo"
    assert line["arrival"].endswith("+00:00")


def test_a_stray_read_before_the_request_does_not_start_the_clock(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "tx.jsonl"
    txlog = TxLog(str(path), clock)
    client, server = FakeClient(1, FakePool()), FakeServer(1)
    txlog.client_data(client, 5)  # a Flush after the last transaction, say
    clock.t += 30  # the client thinks
    txlog.client_data(client, 20)  # its next query
    client.state = State("ACTIVE")
    client.link_time = clock.t
    clock.t += 0.001
    txlog.released(client, server, clock.t)
    txlog.close()
    [line] = lines(path)
    assert line["wait_us"] == 0 and line["xact_us"] == 1000 and line["bytes_in"] == 25


def test_rollback_commit_and_a_pipeline_line(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "tx.jsonl"
    txlog = TxLog(str(path), clock)
    pool = FakePool()
    first, second = FakeClient(1, pool), FakeClient(2, pool)
    server = FakeServer(9, client=first, chain=[second])
    for client in (first, second):
        txlog.client_data(client, 5)
        client.link_time = clock.t
    # One read holds the first client's ROLLBACK and the second's COMMIT.
    server_tap = txlog.tap(server)
    server_tap.feed(m.command_complete("ROLLBACK") + m.ready_for_query(m.TX_IDLE)
                    + m.command_complete("COMMIT") + m.ready_for_query(m.TX_IDLE))
    txlog.released(first, server, clock.t + 0.001)
    txlog.released(second, server, clock.t + 0.002)
    txlog.close()
    got = {line["client_id"]: line for line in lines(path)}
    assert got[1]["outcome"] == "rollback" and got[1]["statements"] == 1
    assert got[2]["outcome"] == "commit" and got[2]["statements"] == 1


def test_waits_that_end_without_a_server(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "tx.jsonl"
    txlog = TxLog(str(path), clock)
    pool = FakePool()
    timed_out, gone, refused = FakeClient(1, pool), FakeClient(2, pool), FakeClient(3, pool)
    for client in (timed_out, gone, refused):
        txlog.client_data(client, 5)
        client.state = State("WAITING")
    clock.t += 2
    txlog.client_closed(timed_out, "query_wait_timeout")
    txlog.client_closed(gone, "client closed the connection")
    txlog.refused(refused, "08P01")
    txlog.close()
    got = {line["client_id"]: line for line in lines(path)}
    assert got[1]["kind"] == "wait" and got[1]["outcome"] == "query_wait_timeout"
    assert got[1]["assigned"] is None and got[1]["xact_us"] is None
    assert got[1]["wait_us"] == 2000000 and got[1]["server_id"] is None
    assert got[2]["outcome"] == "client_gone"
    assert got[3]["outcome"] == "refused" and got[3]["sqlstate"] == "08P01"


def test_a_full_queue_drops_and_counts_never_blocks(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "tx.jsonl"
    txlog = TxLog(str(path), clock, limit=2)
    txlog._stop.set()  # the writer stops at once (nothing queued yet): the deque fills
    txlog._thread.join(5)
    client, server = FakeClient(1, FakePool()), FakeServer(1)
    started = time.monotonic()
    for _ in range(1000):
        txlog.released(client, server, clock.t)
    assert time.monotonic() - started < 1.0
    assert len(txlog.lines) == 2 and txlog.dropped == 998


def test_reopen_writes_to_a_fresh_file_after_rotation(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "tx.jsonl"
    txlog = TxLog(str(path), clock)
    client, server = FakeClient(1, FakePool()), FakeServer(1)
    txlog.released(client, server, clock.t)
    assert wait_for(lambda: len(lines(path)) == 1, 5)
    path.rename(tmp_path / "tx.jsonl.1")
    txlog.reopen()
    txlog.released(client, server, clock.t)
    txlog.close()
    assert len(lines(path)) == 1
    assert len(lines(tmp_path / "tx.jsonl.1")) == 1
    assert txlog.written == 2 and txlog.dropped == 0
