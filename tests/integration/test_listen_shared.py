"""LISTEN/NOTIFY in transaction mode without pinning (listen_mode = shared, the default;
pooling/listening.py, pooler/notifications.py), against a real PostgreSQL, with psycopg 3
(`conn.notifies()`) and asyncpg (`add_listener`) listeners: delivery to every listener,
to a client busy in a transaction on another server after its message, UNLISTEN, a rolled
back LISTEN, a killed listening backend, no server pinned, and listen_mode = pin.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.request
from typing import Any

import asyncpg
import psycopg
import pytest

from pypool.embedded import free_port
from tests.integration.app_client import connect

pytestmark = pytest.mark.timeout(90)

LISTENER_APP = "pypool listener"


def one(conn: psycopg.Connection[Any], sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def direct(postgres: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(postgres.dsn("app", "app", "app-secret"), autocommit=True)


def superuser(postgres: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(postgres.dsn("app", postgres.superuser, postgres.password),
                           autocommit=True)


def listeners(p: Any) -> list[dict[str, Any]]:
    with psycopg.connect(p.dsn("pgbouncer", "pool_admin", "admin-secret"),
                         autocommit=True) as admin:
        cur = admin.execute("SHOW LISTENERS")
        names = [c.name for c in cur.description or []]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def wait_for(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def listening_backends(postgres: Any) -> list[int]:
    rows = postgres.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", params=(LISTENER_APP,))
    return [int(row[0]) for row in rows or []]


def server_pids(postgres: Any, sender: psycopg.Connection[Any]) -> set[int]:
    """The pool's own servers (not the listening connection, not `sender`, a direct one)."""
    rows = postgres.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = 'app' AND usename = 'app'"
        " AND backend_type = 'client backend' AND application_name <> %s"
        " AND pid <> pg_backend_pid() AND pid <> %s",
        params=(LISTENER_APP, sender.info.backend_pid))
    return {int(row[0]) for row in rows or []}


def held(p: Any, channels: int) -> bool:
    """Whether the listening connection LISTENs on `channels` channels."""
    rows = listeners(p)
    return bool(rows) and rows[0]["channels"] == channels


def payloads(conn: psycopg.Connection[Any], count: int, timeout: float = 5.0) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=timeout, stop_after=count)]


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(rf'^pypool_{name}{{[^}}]*database="app"'
                                            rf"[^}}]*}} (\S+)$", text, re.M))


def test_two_psycopg_clients_on_one_channel_both_receive(postgres, pooler) -> None:
    metrics = free_port()
    p = pooler(ini_overrides={"default_pool_size": "2", "metrics_port": str(metrics)})
    with connect(p.dsn()) as a, connect(p.dsn()) as b, direct(postgres) as sender:
        a.execute("LISTEN shared_chan")
        b.execute("LISTEN shared_chan")
        # Heard through the listening connection from now on (not the bridge), so counted.
        wait_for(lambda: held(p, 1))
        for text in ("one", "two", "three"):
            sender.execute("SELECT pg_notify('shared_chan', %s)", (text,))
        assert payloads(a, 3) == ["one", "two", "three"]  # in order
        assert payloads(b, 3) == ["one", "two", "three"]
        # NOTIFY through the pooler goes through like any query.
        a.execute("NOTIFY shared_chan, 'from a'")
        assert payloads(a, 1) == ["from a"]
        assert payloads(b, 1) == ["from a"]
        [row] = listeners(p)
        assert (row["database"], row["user"], row["state"]) == ("app", "app", "listening")
        assert (row["channels"], row["listeners"]) == (1, 2)
        assert row["notifications_received"] == 4
        assert row["notifications_delivered"] == 8
        assert row["pid"] in listening_backends(postgres)
        assert metric(metrics, "listen_channels") == 1
        assert metric(metrics, "listen_clients") == 2
        assert metric(metrics, "listen_connected") == 1
        assert metric(metrics, "notifications_received_total") == 4
        assert metric(metrics, "notifications_delivered_total") == 8


def test_no_server_is_pinned(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b, direct(postgres) as sender:
        a.execute("LISTEN unpinned_chan")
        server = one(a, "SELECT pg_backend_pid()")
        # One server, taken in turns: a holds none between its transactions.
        assert one(b, "SELECT pg_backend_pid()") == server
        # The server a's LISTEN ran on listens no more once another client has it.
        assert one(b, "SELECT count(*) FROM pg_listening_channels()") == 0
        assert server_pids(postgres, sender) == {server}
        assert len(listening_backends(postgres)) == 1
        sender.execute("NOTIFY unpinned_chan, 'still heard'")
        assert payloads(a, 1) == ["still heard"]
        assert list(b.notifies(timeout=0.3)) == []
        with psycopg.connect(p.dsn("pgbouncer", "pool_admin", "admin-secret"),
                             autocommit=True) as admin:
            cur = admin.execute("SHOW CLIENTS")
            names = [c.name for c in cur.description or []]
            pinned = [row[names.index("pinned")] for row in cur.fetchall()
                      if row[names.index("database")] == "app"]
        assert pinned == ["", ""]


def test_a_client_in_a_transaction_on_another_server_gets_it_after_its_message(
        postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "2"})
    with connect(p.dsn()) as a, direct(postgres) as sender:
        a.execute("LISTEN busy_chan")
        # Until the listening connection holds the channel, a's own server hears it for it
        # (the bridge); then that server goes back, idle, and a listens on none.
        wait_for(lambda: held(p, 1))
        a.execute("BEGIN")
        assert one(a, "SELECT count(*) FROM pg_listening_channels()") == 0  # another server
        a.execute("SELECT pg_notify('busy_chan', 'own')")  # delivered at its commit
        # Big rows streamed slowly: the notification arrives while they are on their way
        # and must not cut into one.
        timer = threading.Timer(0.3, sender.execute, ("NOTIFY busy_chan, 'outside'",))
        timer.start()
        rows = a.execute("SELECT repeat('x', 300000) || pg_sleep(0.05)::text "
                         "FROM generate_series(1, 20)").fetchall()
        timer.join()
        assert len(rows) == 20 and all(len(r[0]) == 300000 for r in rows)
        assert one(a, "SELECT 1") == 1
        a.execute("COMMIT")
        assert payloads(a, 2) == ["outside", "own"]


def test_unlisten_and_discard_all_stop_delivery(postgres, pooler) -> None:
    p = pooler()
    with connect(p.dsn()) as a, direct(postgres) as sender:
        a.execute("LISTEN stop_a")
        a.execute("LISTEN stop_b")
        a.execute("UNLISTEN stop_a")
        sender.execute("NOTIFY stop_a, 'gone'")
        sender.execute("NOTIFY stop_b, 'kept'")
        assert payloads(a, 1) == ["kept"]
        assert list(a.notifies(timeout=0.3)) == []
        wait_for(lambda: held(p, 1))
        a.execute("UNLISTEN *")
        sender.execute("NOTIFY stop_b, 'gone too'")
        assert list(a.notifies(timeout=0.3)) == []
        a.execute("LISTEN stop_c")
        a.execute("DISCARD ALL")
        sender.execute("NOTIFY stop_c, 'discarded'")
        assert list(a.notifies(timeout=0.3)) == []
        # Nobody listens: the listening connection goes.
        wait_for(lambda: listeners(p)[0]["state"] == "lost" and not listening_backends(postgres))


def test_a_rolled_back_listen_hears_nothing_and_a_committed_one_at_commit(
        postgres, pooler) -> None:
    p = pooler()
    with connect(p.dsn()) as a, direct(postgres) as sender:
        a.execute("BEGIN")
        a.execute("LISTEN tx_chan")
        a.execute("ROLLBACK")
        sender.execute("NOTIFY tx_chan, 'after rollback'")
        assert list(a.notifies(timeout=0.5)) == []
        a.execute("BEGIN")
        a.execute("LISTEN tx_chan")
        time.sleep(0.3)  # the listening connection LISTENs meanwhile
        sender.execute("NOTIFY tx_chan, 'before commit'")
        a.execute("COMMIT")
        sender.execute("NOTIFY tx_chan, 'after commit'")
        got = payloads(a, 2, timeout=1)
        assert got[-1] == "after commit"
        assert got[0] in ("before commit", "after commit")


def test_a_client_leaving_takes_its_channels(postgres, pooler) -> None:
    p = pooler()
    a = connect(p.dsn())
    a.execute("LISTEN leaving_chan")
    wait_for(lambda: held(p, 1))
    a.close()
    wait_for(lambda: listeners(p)[0]["listeners"] == 0 and not listening_backends(postgres))


def test_a_killed_listening_backend_gives_a_notice_and_delivery_resumes(
        postgres, pooler) -> None:
    p = pooler()
    with connect(p.dsn()) as a, direct(postgres) as sender:
        notices: list[str] = []
        a.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        a.execute("LISTEN killed_chan")
        wait_for(lambda: held(p, 1))
        sender.execute("NOTIFY killed_chan, 'before'")
        assert payloads(a, 1) == ["before"]
        [killed] = listening_backends(postgres)
        with superuser(postgres) as su:
            su.execute("SELECT pg_terminate_backend(%s)", (killed,))
        # Both NOTICEs arrive while idle: read them by waiting on the socket.
        deadline = time.monotonic() + 10
        while len(notices) < 2 and time.monotonic() < deadline:
            list(a.notifies(timeout=0.2))
        assert any("was lost" in n and "may be missed" in n for n in notices), notices
        assert any("listening again" in n for n in notices), notices
        [again] = listening_backends(postgres)
        assert again != killed
        sender.execute("NOTIFY killed_chan, 'after'")
        assert payloads(a, 1) == ["after"]
        assert listeners(p)[0]["lost"] == 1


def test_asyncpg_add_listener(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})

    async def run() -> None:
        got: list[tuple[str, str]] = []
        heard = asyncio.Event()

        def on_notify(_conn: Any, _pid: int, channel: str, payload: str) -> None:
            got.append((channel, payload))
            if len(got) == 2:
                heard.set()

        conn = await asyncpg.connect(p.dsn(), statement_cache_size=0)
        other = await asyncpg.connect(p.dsn(), statement_cache_size=0)
        try:
            await conn.add_listener("asyncpg_chan", on_notify)
            # the pool's one server serves the other client meanwhile
            assert await other.fetchval("SELECT 1") == 1
            await other.execute("NOTIFY asyncpg_chan, 'one'")
            await other.execute("SELECT pg_notify('asyncpg_chan', 'two')")
            await asyncio.wait_for(heard.wait(), 10)
            assert got == [("asyncpg_chan", "one"), ("asyncpg_chan", "two")]
            await conn.remove_listener("asyncpg_chan", on_notify)
            await other.execute("NOTIFY asyncpg_chan, 'three'")
            await asyncio.sleep(0.3)
            assert len(got) == 2
        finally:
            await conn.close()
            await other.close()

    asyncio.run(run())


def test_listen_mode_pin_keeps_the_server(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "2", "listen_mode": "pin"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b, direct(postgres) as sender:
        notices: list[str] = []
        a.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        a.execute("LISTEN pin_chan")
        server = one(a, "SELECT pg_backend_pid()")
        assert any("keeps its server" in n for n in notices)
        assert one(b, "SELECT pg_backend_pid()") != server
        assert one(a, "SELECT count(*) FROM pg_listening_channels()") == 1
        sender.execute("NOTIFY pin_chan, 'pinned'")
        a.execute("SELECT 1")
        assert payloads(a, 1) == ["pinned"]
        assert listeners(p) == []
        assert listening_backends(postgres) == []
