"""Back-pressure: a client that stops reading must not make the pooler buffer the result.

The pooler pauses reading from the server while the client's socket buffer is full, so
PostgreSQL blocks on its send instead of the pooler's memory growing with the result.
"""

from __future__ import annotations

import socket
import time

import pytest

from tests.conftest import rss_mib
from tests.integration.rawclient import RawClient

pytestmark = pytest.mark.timeout(90)

ROWS = 200_000
ROW_BYTES = 1000  # about 200 MB of DataRow in all


def test_slow_reader_does_not_balloon_pooler_memory(pooler) -> None:
    p = pooler({"auth_type": "trust"})
    with RawClient(p.host, p.port, timeout=60) as client:
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        client.login("app", "app")
        before = rss_mib(p.proc.pid)
        client.query(f"SELECT repeat('x', {ROW_BYTES}) FROM generate_series(1, {ROWS})")
        time.sleep(3)  # read nothing while PostgreSQL produces the whole result
        stalled = rss_mib(p.proc.pid)
        rows = 0
        tag = b""
        while True:
            msg = client.read_message()
            assert msg is not None, "connection closed mid-result"
            kind, body = msg
            if kind == ord("D"):
                rows += 1
            elif kind == ord("C"):
                tag = body
            elif kind == ord("Z"):
                break
    assert rows == ROWS
    assert tag.rstrip(b"\x00") == f"SELECT {ROWS}".encode()
    # The result is ~200 MB; with back-pressure the pooler holds at most a few socket
    # buffers' worth of it.
    assert stalled - before < 40, f"pooler RSS grew {stalled - before:.0f} MiB while stalled"
