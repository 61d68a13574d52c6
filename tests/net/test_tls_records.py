"""net/tls_records.py: a client's TLS writes handed over in pieces of at most 8 KiB."""

from __future__ import annotations

from typing import Any

import pytest

from pypool.net.tls_records import RECORD_MAX, write_in_records

pytestmark = pytest.mark.timeout(10)


class Inner:
    """What the TLS transport was handed, one list per call, kept as handed (a TLS layer
    that has not encrypted a piece yet holds it so)."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    def writelines(self, pieces: Any) -> None:
        self.calls.append(list(pieces))


def test_a_large_write_goes_in_pieces_of_8_kib_in_order() -> None:
    inner = Inner()
    data = bytes(range(256)) * 100  # 25,600 bytes
    write_in_records(inner, data)
    [pieces] = inner.calls
    assert [len(piece) for piece in pieces] == [RECORD_MAX] * 3 + [1024]
    assert b"".join(bytes(piece) for piece in pieces) == data


def test_a_reused_buffer_cannot_change_what_was_written() -> None:
    inner = Inner()
    buffer = bytearray(b"a" * 20000)
    write_in_records(inner, buffer)
    buffer[:] = b"b" * 20000
    assert b"".join(bytes(piece) for piece in inner.calls[0]) == b"a" * 20000
