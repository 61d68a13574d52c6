"""Cancel keys in PgBouncer's peering layout (protocol/cancel_key.py), fed plain integers."""

from __future__ import annotations

import struct

from pypool.protocol import cancel_key


def key_bytes(pid: int, secret: int) -> bytes:
    return struct.pack("!II", pid, secret)


def test_without_peer_or_worker_the_random_bits_are_kept() -> None:
    assert cancel_key.issue(0x12345678, 0xFFFFFFFC, 0) == (0x12345678, 0xFFFFFFFC)


def test_peer_id_goes_in_bytes_1_and_2_low_byte_first_and_the_ttl_is_full() -> None:
    pid, secret = cancel_key.issue(0x7FFFFFFF, 0x00000000, 0xBEEF)
    raw = key_bytes(pid, secret)
    assert raw[0] == 0x7F and raw[3] == 0xFF  # random bytes untouched
    assert (raw[1], raw[2]) == (0xEF, 0xBE)
    assert raw[7] & 3 == 3 and cancel_key.ttl(secret) == 3
    assert cancel_key.peer_of(pid) == 0xBEEF


def test_worker_number_goes_in_byte_3() -> None:
    pid, _ = cancel_key.issue(0x7FFFFFFF, 0, 5, worker=7)
    assert key_bytes(pid, 0)[3] == 7 and cancel_key.worker_of(pid) == 7
    assert cancel_key.peer_of(pid) == 5


def test_each_forward_spends_one_ttl_and_the_owner_restores_it() -> None:
    _, secret = cancel_key.issue(1, 0xABCDEF00, 1)
    hops = []
    while cancel_key.ttl(secret):
        secret = cancel_key.forwarded(secret)
        hops.append(secret)
    assert len(hops) == 3
    assert all(cancel_key.as_issued(s) == 0xABCDEF03 for s in hops)
    assert hops[-1] >> 2 == 0xABCDEF00 >> 2  # only the TTL bits changed
