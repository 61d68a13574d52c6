"""net/replication_pipe.py: the two ends of a replication pair, fed bytes over fake transports."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.net.replication_pipe import CLIENT, SERVER, ReplicationPipe

pytestmark = pytest.mark.timeout(10)

STATUS_UPDATE = b"d" + (38).to_bytes(4, "big") + b"r" + bytes(33)
TERMINATE = b"X\x00\x00\x00\x04"


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.written += data

    def writelines(self, pieces: Any) -> None:
        self.records = [len(piece) for piece in pieces]
        for piece in pieces:
            self.write(piece)

    def close(self) -> None:
        self.closed = True

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class FakeConnection:
    def __init__(self, tls_info: str = "") -> None:
        self.transport = FakeTransport()
        self.tls_info = tls_info
        self._reading_paused = False
        self.writing_paused = False


class Stats:
    bytes_received = 0
    bytes_sent = 0


def joined(held: bytes = b"", tls: bool = False) -> tuple[
        ReplicationPipe, FakeConnection, FakeConnection, list[str]]:
    client, server, lost = FakeConnection("TLSv1.3" if tls else ""), FakeConnection(), []
    pipe = ReplicationPipe(client, server, Stats(),  # type: ignore[arg-type]
                           lambda _pipe, side, _exc: lost.append(side))
    pipe.start(held)
    return pipe, client, server, lost


def test_bytes_pass_both_ways_as_they_came() -> None:
    pipe, client, server, lost = joined()
    client.transport.protocol.data_received(STATUS_UPDATE[:7])
    client.transport.protocol.data_received(STATUS_UPDATE[7:])
    server.transport.protocol.data_received(b"w" * 100)
    assert server.transport.written == STATUS_UPDATE
    assert client.transport.written == b"w" * 100
    assert not pipe.terminated and lost == []


def test_a_terminate_ends_the_pair_from_the_clients_side() -> None:
    pipe, client, server, lost = joined()
    client.transport.protocol.data_received(STATUS_UPDATE + TERMINATE[:2])
    client.transport.protocol.data_received(TERMINATE[2:] + b"Q\x00\x00\x00\x05x")
    client.transport.protocol.data_received(b"more")  # after the Terminate: nobody's
    assert server.transport.written == STATUS_UPDATE + TERMINATE  # the walsender ends cleanly
    assert pipe.terminated and lost == [CLIENT]
    assert client.transport.closed and server.transport.closed
    # The sockets' own closes come later and are heard once each, the client's not again.
    client.transport.protocol.connection_lost(None)
    server.transport.protocol.connection_lost(None)
    assert lost == [CLIENT, SERVER]


def test_a_terminate_among_the_held_bytes() -> None:
    pipe, _client, server, lost = joined(STATUS_UPDATE + TERMINATE + b"junk")
    assert server.transport.written == STATUS_UPDATE + TERMINATE
    assert pipe.terminated and lost == [CLIENT]
    assert pipe.stats.bytes_received == len(STATUS_UPDATE + TERMINATE)


def test_back_pressure_pauses_the_other_sides_reading() -> None:
    _pipe, client, server, _lost = joined()
    client.transport.protocol.pause_writing()  # the client's socket buffer is full
    assert not server.transport.reading and client.transport.reading
    client.transport.protocol.resume_writing()
    assert server.transport.reading


def test_wal_to_a_tls_client_goes_in_records_of_8_kib() -> None:
    _pipe, client, server, _lost = joined(tls=True)
    server.transport.protocol.data_received(b"w" * 20000)
    assert client.transport.records == [8192, 8192, 3616]
    assert client.transport.written == b"w" * 20000
    client.transport.protocol.data_received(STATUS_UPDATE * 300)  # to the server: as it came
    assert server.transport.written == STATUS_UPDATE * 300
