"""tcp_keepidle reaches the sockets pypool accepts (set on its listening sockets, which the
kernel copies into each accepted one: net/socket_options.py). Read from the kernel's own
table of the pooler's side of the connection (/proc/net/tcp: timer 2 is the keepalive
timer, its expiry in clock ticks), with a real client through a real PostgreSQL login."""

from __future__ import annotations

import os
import socket
import time

import psycopg
import pytest

pytestmark = pytest.mark.timeout(60)


def _keepalive_ticks(local_port: int, peer_port: int) -> int | None:
    """The keepalive timer's ticks left on the socket local_port <-> peer_port, or None."""
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            local, remote, timer = fields[1], fields[2], fields[5]
            if (int(local.split(":")[1], 16) == local_port
                    and int(remote.split(":")[1], 16) == peer_port):
                kind, ticks = timer.split(":")
                return int(ticks, 16) if int(kind, 16) == 2 else None
    return None


def test_tcp_keepidle_applies_to_accepted_clients(pooler) -> None:
    p = pooler(ini_overrides={"tcp_keepalive": "1", "tcp_keepidle": "77"})
    with psycopg.connect(p.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            peer_port = sock.getsockname()[1]  # the client's end: the pooler's peer
        # Right after a reply the retransmit timer runs until its ACK: then keepalive's.
        ticks = None
        for _ in range(20):
            time.sleep(0.1)
            ticks = _keepalive_ticks(p.port, peer_port)
            if ticks is not None:
                break
    # Armed, and at 77 s rather than the kernel's default idle time (7,200 s unless tuned).
    assert ticks is not None
    assert 0 < ticks <= 77 * os.sysconf("SC_CLK_TCK")
