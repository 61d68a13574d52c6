"""A peer pool's bookkeeping (pooling/peer_pool.py): pool_size slots, the rest queued."""

from __future__ import annotations

from pypool.pooling.peer_pool import PeerPool


def test_at_most_pool_size_in_flight_then_the_queue_takes_each_freed_slot() -> None:
    pool = PeerPool(3)
    assert pool.take_slot(2) and pool.take_slot(2)
    assert not pool.take_slot(2)
    pool.waiting.append((1, 1))
    pool.sent()
    assert (pool.login, pool.active) == (1, 1)
    assert pool.done(was_sent=True) == (1, 1)  # the freed slot goes to the queued key
    assert (pool.login, pool.active, len(pool.waiting)) == (2, 0, 0)
    assert pool.done(was_sent=False) is None
    assert pool.done(was_sent=False) is None
    assert pool.idle


def test_a_zero_pool_size_still_lets_one_through() -> None:
    pool = PeerPool(1)
    assert pool.take_slot(0)
    assert not pool.take_slot(0)
