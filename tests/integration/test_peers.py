"""Peers and workers: a CancelRequest that reaches a pooler other than the one that issued
its key is passed on to the owner (pooler/peers.py, protocol/cancel_key.py), against real
pypool processes and a real PostgreSQL.

Keys are laid out as PgBouncer 1.19+ lays them out with `peer_id`: bytes 1-2 of the key
name the issuing peer, the two low bits of byte 7 are a forwarding TTL. A peer_id with no
[peers] entry, or a TTL worn to 0, drops the request; the query it named runs on.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

import pytest

from pypool.protocol import messages as m
from tests.conftest import ADMIN_PASSWORD, ADMIN_USER, APP_USER, Pooler, PoolerFactory
from tests.integration.app_client import connect
from tests.integration.polling import wait_for
from tests.integration.rawclient import RawClient

pytestmark = pytest.mark.timeout(60)

CANCEL_REQUEST_CODE = 80877102


def send_cancel(host: str, port: int, key: tuple[int, int]) -> None:
    """A CancelRequest on a new connection; returns once the pooler has closed it."""
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(struct.pack("!IIII", 16, CANCEL_REQUEST_CODE, *key))
        assert sock.recv(1024) == b""


class SlowQuery(threading.Thread):
    """A trust login over a raw socket, then `SELECT pg_sleep(seconds)`: keeps the key the
    pooler issued and the SQLSTATE the query ended with ("" for none)."""

    def __init__(self, p: Pooler, seconds: float) -> None:
        super().__init__(daemon=True)
        self.raw = RawClient(p.host, p.port)
        login = self.raw.login(APP_USER, "app")
        assert login.error is None and login.backend_key is not None, login.error
        self.key: tuple[int, int] = login.backend_key
        self.seconds = seconds
        self.sqlstate: str | None = None

    def run(self) -> None:
        self.raw.query(f"SELECT pg_sleep({self.seconds}) /* peer-cancel */")
        state = ""
        for kind, body in self.raw.read_until(m.READY_FOR_QUERY):
            if kind == m.ERROR_RESPONSE:
                state = m.parse_error_fields(body)["C"]
        self.sqlstate = state
        self.raw.close()


def running(postgres: Any) -> int:
    rows = postgres.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
                            " AND query LIKE '%peer-cancel%' AND pid <> pg_backend_pid()")
    return int(rows[0][0])


def show(p: Pooler, what: str) -> list[tuple[Any, ...]]:
    with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
        return list(admin.execute(f"SHOW {what}").fetchall())


def peered(pooler: PoolerFactory, peer_id: int, peers: str = "") -> Pooler:
    return pooler(ini_overrides={"auth_type": "trust", "peer_id": str(peer_id)},
                  extra_sections=f"[peers]\n{peers}" if peers else "")


def test_keys_carry_the_peer_id_and_a_full_ttl(pooler: PoolerFactory) -> None:
    p = peered(pooler, 0x1234)
    for _ in range(20):
        with RawClient(p.host, p.port) as raw:
            pid, secret = raw.login(APP_USER, "app").backend_key or (0, 0)
        key = struct.pack("!II", pid, secret)
        assert key[1] + (key[2] << 8) == 0x1234  # low byte first, as PgBouncer
        assert key[7] & 3 == 3
        assert 0 < pid < 1 << 31


def test_cancel_sent_to_a_peer_reaches_the_owner(postgres: Any, pooler: PoolerFactory) -> None:
    """The client is on pooler 1; its CancelRequest lands on pooler 2, which names pooler 1
    by its unix socket directory. Pooler 1 names pooler 2 by TCP, the other address kind."""
    one = peered(pooler, 1)
    two = peered(pooler, 2, f"1 = host={one.ini_path.parent} port={one.port}\n")
    one.rewrite_config(extra_sections=f"[peers]\n2 = host=127.0.0.1 port={two.port}\n")
    one.reload()
    assert wait_for(lambda: len(show(one, "PEERS")) == 1, 5)
    for owner, other in ((one, two), (two, one)):
        query = SlowQuery(owner, 10)
        query.start()
        assert wait_for(lambda: running(postgres) == 1, 5)
        start = time.monotonic()
        send_cancel(other.host, other.port, query.key)
        query.join(5)
        assert query.sqlstate == "57014"  # query_canceled
        assert time.monotonic() - start < 3
    assert show(two, "PEERS") == [(1, str(one.ini_path.parent), one.port, 5)]
    assert show(one, "PEER_POOLS") == [(2, 0, 0, 0, 0)]  # used, and idle again
    lists = dict(show(one, "LISTS"))
    assert lists["peers"] == 1 and lists["peer_pools"] == 1


def test_unknown_peer_and_spent_ttl_are_dropped(postgres: Any, pooler: PoolerFactory) -> None:
    """Pooler 1 lists peer 2 at its own address (a configuration mistake): a key naming
    peer 2 goes round until its TTL is spent, then is dropped. A key naming peer 9, which
    is not listed, is dropped at once. The query they name runs to its end."""
    p = peered(pooler, 1)
    p.rewrite_config(extra_sections=f"[peers]\n2 = host=127.0.0.1 port={p.port}\n")
    p.reload()
    assert wait_for(lambda: len(show(p, "PEERS")) == 1, 5)
    query = SlowQuery(p, 1.5)
    query.start()
    assert wait_for(lambda: running(postgres) == 1, 5)
    pid, secret = query.key
    for peer_id in (2, 9):
        # The same random bits, another issuer.
        forged = (pid & 0x7F0000FF) | (peer_id << 16)
        send_cancel(p.host, p.port, (forged, secret))
    query.join(5)
    assert query.sqlstate == ""
    assert wait_for(lambda: "TTL was exhausted" in p.log(), 5), p.log()
    assert "could not find peer 9" in p.log()


def test_bad_peers_are_refused_at_start(pooler: PoolerFactory, tmp_path: Any) -> None:
    from pypool.settings import SettingsError, load_ini

    for section, text in (("0 = host=/tmp", "between 1 and 65535"),
                          ("70000 = host=/tmp", "between 1 and 65535"),
                          ("3 = port=6432", "host was not provided"),
                          ("3 = host=x dbname=y", "unrecognized connection parameter")):
        ini = tmp_path / "bad.ini"
        ini.write_text(f"[pgbouncer]\nlisten_port = 6000\n[peers]\n{section}\n")
        with pytest.raises(SettingsError, match=text):
            load_ini(ini)


def test_with_workers_a_cancel_works_whichever_worker_takes_it(
        postgres: Any, pooler: PoolerFactory) -> None:
    """workers = 2 share the port; each writes its number into byte 3 of its keys, and a
    cancel taken by the other worker is passed on to it. Ten cancels, each must land."""
    p = pooler(ini_overrides={"auth_type": "trust", "workers": "2"})
    workers_seen = set()
    for _ in range(10):
        query = SlowQuery(p, 10)
        workers_seen.add(query.key[0] & 0xFF)
        query.start()
        assert wait_for(lambda: running(postgres) == 1, 5)
        send_cancel(p.host, p.port, query.key)
        query.join(5)
        assert query.sqlstate == "57014"
    assert workers_seen <= {0, 1}
