"""net/tls_records.py: a client's TLS writes handed over in pieces of at most 8 KiB."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.net.tls_records import RECORD_MAX, RecordSized

pytestmark = pytest.mark.timeout(10)


class Inner:
    """What the TLS transport was handed, one list per call, kept as handed (a TLS layer
    that has not encrypted a piece yet holds it so)."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    def write(self, data: Any) -> None:
        self.calls.append([data])

    def writelines(self, pieces: Any) -> None:
        self.calls.append(list(pieces))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5)}.get(name, default)


def test_small_writes_go_through_as_they_are() -> None:
    inner = Inner()
    RecordSized(inner).write(b"x" * RECORD_MAX)
    assert inner.calls == [[b"x" * RECORD_MAX]]


def test_a_large_write_goes_in_pieces_of_8_kib_in_order() -> None:
    inner = Inner()
    data = bytes(range(256)) * 100  # 25,600 bytes
    RecordSized(inner).write(data)
    [pieces] = inner.calls
    assert [len(piece) for piece in pieces] == [8192, 8192, 8192, 1024]
    assert b"".join(bytes(piece) for piece in pieces) == data


def test_a_reused_buffer_cannot_change_what_was_written() -> None:
    inner = Inner()
    buffer = bytearray(b"a" * 20000)
    RecordSized(inner).write(buffer)
    buffer[:] = b"b" * 20000
    assert b"".join(bytes(piece) for piece in inner.calls[0]) == b"a" * 20000


def test_the_rest_is_the_inner_transports() -> None:
    assert RecordSized(Inner()).get_extra_info("peername") == ("127.0.0.1", 5)
