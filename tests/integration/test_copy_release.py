"""COPY and the reply bookkeeping: a COPY must never leave its server pinned to its client.

Both cases here pinned a server before the frontend ledger (core/ledger.py) learnt that
PostgreSQL ignores Syncs during copy-in and CopyData after a failed COPY. With a pool of
one, a pinned server shows at once: the next client waits, and is refused after
query_wait_timeout instead of served.
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from tests.conftest import rows_in

from . import pgwire
from .pgwire import Wire, bind, execute, message, parse, query, sync

pytestmark = pytest.mark.timeout(60)


def copy_data(row: str) -> bytes:
    return message(b"d", row.encode())


def copy_done() -> bytes:
    return message(b"c")


def copy_fail(reason: str) -> bytes:
    return message(b"f", reason.encode() + b"\x00")


async def connect(p) -> Wire:
    return await Wire.connect(p.host, p.port, "app", "app-secret", "app")


async def served_promptly(p) -> None:
    """Another client gets the pool's only server: nobody kept it."""
    other = await connect(p)
    try:
        got = await asyncio.wait_for(other.run(query("SELECT 42")), 5)
        assert pgwire.kinds(got) == "TDCZ", got
        assert got[-1] == ("Z", "I"), got
    finally:
        await other.close()


@pytest.fixture
def one_server(pooler, app_table):
    p = pooler({"default_pool_size": "1", "query_wait_timeout": "3"})
    return p, app_table


async def backend_pid(wire: Wire) -> str:
    got = await wire.run(query("SELECT pg_backend_pid()"))
    rows = [s[1][0] for s in got if s[0] == "D"]
    assert len(rows) == 1, got
    return str(rows[0])


@pytest.mark.parametrize("prepared", ["200", "0"], ids=["rewriting", "no-rewriting"])
async def test_extended_copy_from_stdin_releases_its_server(pooler, app_table, postgres,
                                                            prepared) -> None:
    """Parse/Bind/Execute/Sync, CopyData, CopyDone, Sync: PostgreSQL ignores the first Sync
    (it arrives in copy-in mode), so one ReadyForQuery answers both. The server goes back,
    the same server: with prepared statements on, their request queue strikes that Sync too
    (it used to keep it, so the server was closed at release as out of step)."""
    p = pooler({"default_pool_size": "1", "query_wait_timeout": "3",
                "max_prepared_statements": prepared})
    table = app_table
    wire = await connect(p)
    try:
        before = await backend_pid(wire)
        wire.send(parse("", f"COPY {table} (x) FROM STDIN"), bind("", ""), execute(), sync())
        kind, body = (await wire.read_n(3))[-1]  # ParseComplete, BindComplete, CopyIn
        assert kind == b"G", (kind, body)
        wire.send(copy_data("1\n"), copy_data("2\n"), copy_done(), sync())
        got = await wire.until_ready()
        assert [k for k, _ in got] == [b"C", b"Z"], got
        assert got[0][1].rstrip(b"\x00") == b"COPY 2"
        assert got[-1][1] == b"I"
        await served_promptly(p)
        # and this client carries on normally, on the very server it had
        assert await backend_pid(wire) == before
        assert not p.log().count("out of step")
    finally:
        await wire.close()
    assert rows_in(postgres, table) == 2


async def test_extended_copy_sent_in_one_go_releases_its_server(one_server) -> None:
    """A driver that pipelines the whole COPY before any reply: the same one ReadyForQuery."""
    p, table = one_server
    wire = await connect(p)
    try:
        wire.send(parse("", f"COPY {table} (x) FROM STDIN"), bind("", ""), execute(), sync(),
                  copy_data("7\n"), copy_done(), sync())
        got = await wire.until_ready()
        assert [k for k, _ in got] == [b"1", b"2", b"G", b"C", b"Z"], got
        await served_promptly(p)
    finally:
        await wire.close()


async def test_extended_copy_that_fails_releases_its_server(one_server) -> None:
    """Bad data: the server reports the error and skips to the client's next Sync."""
    p, table = one_server
    wire = await connect(p)
    try:
        wire.send(parse("", f"COPY {table} (x) FROM STDIN"), bind("", ""), execute(), sync())
        assert (await wire.read_n(3))[-1][0] == b"G"
        wire.send(copy_data("not a number\n"), copy_done(), sync())
        got = await wire.until_ready()
        assert got[0][0] == b"E", got
        assert got[-1] == (b"Z", b"I"), got
        await served_promptly(p)
    finally:
        await wire.close()


async def test_copy_data_after_a_failed_copy_takes_no_server(one_server) -> None:
    """Simple-protocol COPY whose data is refused at once: ErrorResponse and ReadyForQuery
    come back while the client is still sending. Its late CopyData and CopyDone are ignored
    by PostgreSQL; they must not take the server back for a reply that never comes."""
    p, table = one_server
    wire = await connect(p)
    try:
        wire.send(query(f"COPY {table} (x) FROM STDIN"))
        assert (await wire.read_n(1))[0][0] == b"G"
        wire.send(copy_fail("changed my mind"))
        got = await wire.until_ready()
        assert got[0][0] == b"E" and got[-1] == (b"Z", b"I"), got
        # The COPY is over: these are strays.
        wire.send(copy_data("3\n"), copy_done())
        await asyncio.sleep(0.3)
        await served_promptly(p)
        again = await wire.run(query("SELECT 1"))
        assert again[-1] == ("Z", "I"), again
    finally:
        await wire.close()


async def test_a_large_stray_copy_data_is_dropped_whole(one_server) -> None:
    """A stray CopyData bigger than one read is dropped to its last byte: what follows it
    is read as the next message, not as garbage."""
    p, _ = one_server
    wire = await connect(p)
    try:
        big = b"x" * (1 << 20)
        wire.send(b"d" + struct.pack("!I", len(big) + 4) + big, query("SELECT 5"))
        got = await wire.until_ready()
        assert got[-1] == (b"Z", b"I"), got
        assert any(k == b"D" for k, _ in got), got
    finally:
        await wire.close()


async def copy_failed_mid_message(p, table: str) -> tuple[Wire, bytes]:
    """A client whose COPY fails on its bad first row while the start of a large CopyData
    after it is already on the server's socket: returns it, and the rest of that message."""
    wire = await connect(p)
    wire.send(query(f"COPY {table} (x) FROM STDIN"))
    assert (await wire.read_n(1))[0][0] == b"G"
    big = copy_data("7\n" * 50_000)
    wire.send(copy_data("not a number\n") + big[:1000])
    got = await wire.until_ready()
    assert got[0][0] == b"E" and got[-1] == (b"Z", b"I"), got
    return wire, big[1000:]


async def test_a_copy_failing_mid_message_hands_on_its_server_only_at_the_message_end(
        one_server) -> None:
    """The backend reads the rest of that CopyData (and ignores it) before anything else:
    had the server gone to the next client at the ReadyForQuery, its query would have been
    read as that rest, and it would wait for ever. It goes once the rest is sent."""
    p, table = one_server
    other = await connect(p)
    wire, rest = await copy_failed_mid_message(p, table)
    try:
        waiting = asyncio.create_task(other.run(query("SELECT 42")))
        await asyncio.sleep(0.3)
        assert not waiting.done(), "handed the server while the message was unfinished"
        wire.send(rest, copy_done())
        got_other = await asyncio.wait_for(waiting, 5)
        assert pgwire.kinds(got_other) == "TDCZ", got_other
        again = await wire.run(query("SELECT 1"))
        assert again[-1] == ("Z", "I"), again
    finally:
        await other.close()
        await wire.close()


async def test_a_client_gone_mid_message_after_its_copy_failed_leaves_no_server(
        one_server) -> None:
    """The same client leaves before the rest of its message: the server is closed, and
    the next client is served by another."""
    p, table = one_server
    wire, _ = await copy_failed_mid_message(p, table)
    await wire.close()
    await served_promptly(p)
