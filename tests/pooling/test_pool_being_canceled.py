"""Pool.being_canceled, sans-IO: a free server that a CancelRequest is still travelling to
is out of reach (PgBouncer's sv_being_canceled) but still one of the pool's servers."""

from __future__ import annotations

import pytest

from pypool.pooling.pool import Pool, PoolLimits

pytestmark = pytest.mark.timeout(10)

BIG = 1 << 30


def make_pool(pool_size: int = 2, min_pool_size: int = 0) -> Pool:
    return Pool("app", "app", PoolLimits(pool_size, min_pool_size, 0, 5.0, "transaction"))


def parked_pool(pool_size: int = 2) -> Pool:
    """A pool with server s1 parked after its client's cancel; s0 idle."""
    pool = make_pool(pool_size)
    pool.put_idle("s0")
    pool.active.add("s1")
    pool.park_canceled("s1")
    return pool


def test_park_canceled_moves_the_server_out_of_active() -> None:
    pool = parked_pool()
    assert "s1" not in pool.active
    assert pool.being_canceled == {"s1"}
    assert pool.idle == ["s0"]


def test_a_parked_server_still_counts_towards_pool_size() -> None:
    pool = parked_pool(pool_size=2)
    assert pool.server_count == 2
    pool.enqueue("c1")
    pool.enqueue("c2")
    # s0 serves one waiter; no room for a third server while s1 waits for its cancel.
    assert pool.servers_wanted(0.0, 0.0, BIG, BIG) == 0


def test_a_parked_server_counts_towards_min_pool_size() -> None:
    pool = make_pool(pool_size=3, min_pool_size=2)
    pool.active.add("s1")
    pool.park_canceled("s1")
    assert pool.servers_wanted(0.0, None, BIG, BIG) == 1


def test_take_idle_never_returns_a_parked_server() -> None:
    pool = parked_pool()
    assert pool.take_idle() == "s0"
    assert pool.take_idle() is None
    assert pool.being_canceled == {"s1"}
    assert pool.active == {"s0"}


def test_take_idle_of_a_pool_with_only_a_parked_server() -> None:
    pool = make_pool()
    pool.active.add("s1")
    pool.park_canceled("s1")
    assert pool.take_idle() is None
    assert pool.server_count == 1


def test_unpark_brings_a_parked_server_back() -> None:
    pool = parked_pool()
    pool.unpark("s1")  # the cancel has landed
    assert pool.being_canceled == set() and "s1" in pool.active
    pool.put_idle("s1")  # and nobody waits
    assert pool.active == set()
    assert pool.idle == ["s0", "s1"]
    assert pool.server_count == 2
    assert pool.take_idle() == "s1"  # last in, first out


def test_forget_drops_a_parked_server() -> None:
    pool = parked_pool()
    pool.forget("s1")  # closed: the cancel did not complete, or the server died
    assert pool.being_canceled == set()
    assert "s1" not in pool.active and "s1" not in pool.idle
    assert pool.server_count == 1
    pool.enqueue("c1")
    pool.enqueue("c2")
    assert pool.servers_wanted(0.0, 0.0, BIG, BIG) == 1  # its place is free again


def test_park_canceled_twice_keeps_one_entry() -> None:
    pool = parked_pool()
    pool.park_canceled("s1")
    assert pool.being_canceled == {"s1"}
    assert pool.server_count == 2
