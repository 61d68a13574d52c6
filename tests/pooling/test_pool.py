"""Pool bookkeeping, sans-IO: how many servers to open, which idle server, which waiter."""

from __future__ import annotations

import pytest

from pypool.core.states import ServerState
from pypool.pooling.pool import Pool, PoolLimits

pytestmark = pytest.mark.timeout(10)

BIG = 1 << 30


def make_pool(
    pool_size: int = 3,
    min_pool_size: int = 0,
    reserve_pool_size: int = 0,
    reserve_pool_timeout: float = 5.0,
) -> Pool:
    return Pool(
        "app", "app",
        PoolLimits(pool_size, min_pool_size, reserve_pool_size, reserve_pool_timeout,
                   "transaction"),
    )


def wait(pool: Pool, n: int) -> list[str]:
    clients = [f"c{len(pool.waiting) + i}" for i in range(n)]
    for client in clients:
        pool.enqueue(client)
    return clients


def test_nothing_wanted_when_nobody_waits() -> None:
    assert make_pool().servers_wanted(0.0, None, BIG, BIG) == 0


def test_one_per_waiting_client_up_to_pool_size() -> None:
    pool = make_pool(pool_size=3)
    wait(pool, 2)
    assert pool.servers_wanted(0.0, 0.0, BIG, BIG) == 2
    wait(pool, 5)
    assert pool.servers_wanted(0.0, 0.0, BIG, BIG) == 3


def test_logins_in_progress_count_towards_the_waiters() -> None:
    pool = make_pool(pool_size=5)
    wait(pool, 3)
    pool.login.update({"s1", "s2"})
    assert pool.servers_wanted(0.0, 0.0, BIG, BIG) == 1
    pool.login.add("s3")
    assert pool.servers_wanted(0.0, 0.0, BIG, BIG) == 0


def test_existing_servers_count_towards_pool_size() -> None:
    pool = make_pool(pool_size=3)
    pool.active.update({"s1", "s2"})
    wait(pool, 4)
    assert pool.server_count == 2
    assert pool.servers_wanted(0.0, 0.0, BIG, BIG) == 1
    pool.idle.append("s3")
    assert pool.servers_wanted(0.0, 0.0, BIG, BIG) == 0


def test_min_pool_size_without_waiters() -> None:
    pool = make_pool(pool_size=5, min_pool_size=2)
    assert pool.servers_wanted(0.0, None, BIG, BIG) == 2
    pool.idle.append("s1")
    assert pool.servers_wanted(0.0, None, BIG, BIG) == 1
    pool.login.add("s2")
    assert pool.servers_wanted(0.0, None, BIG, BIG) == 0


def test_min_pool_size_within_pool_size() -> None:
    pool = make_pool(pool_size=2, min_pool_size=5)
    assert pool.servers_wanted(0.0, None, BIG, BIG) == 2


def test_reserve_only_after_reserve_pool_timeout() -> None:
    pool = make_pool(pool_size=2, reserve_pool_size=3, reserve_pool_timeout=5.0)
    pool.active.update({"s1", "s2"})
    wait(pool, 10)
    started = 100.0
    assert pool.servers_wanted(started + 4.9, started, BIG, BIG) == 0
    assert pool.servers_wanted(started + 5.0, started, BIG, BIG) == 3
    assert pool.servers_wanted(started + 60.0, started, BIG, BIG) == 3


def test_reserve_covers_only_what_waiters_need() -> None:
    pool = make_pool(pool_size=2, reserve_pool_size=3, reserve_pool_timeout=1.0)
    pool.active.update({"s1", "s2"})
    wait(pool, 1)
    assert pool.servers_wanted(10.0, 0.0, BIG, BIG) == 1


def test_reserve_not_used_without_waiters() -> None:
    pool = make_pool(pool_size=2, min_pool_size=0, reserve_pool_size=3,
                     reserve_pool_timeout=0.0)
    pool.active.update({"s1", "s2"})
    assert pool.servers_wanted(10.0, None, BIG, BIG) == 0


def test_zero_reserve_pool_size_never_grows() -> None:
    pool = make_pool(pool_size=2, reserve_pool_size=0, reserve_pool_timeout=0.0)
    pool.active.update({"s1", "s2"})
    wait(pool, 5)
    assert pool.servers_wanted(1000.0, 0.0, BIG, BIG) == 0


@pytest.mark.parametrize(("room_db", "room_user", "expected"),
                         [(1, BIG, 1), (BIG, 2, 2), (0, BIG, 0), (BIG, 0, 0), (-3, BIG, 0)])
def test_database_and_user_caps(room_db: int, room_user: int, expected: int) -> None:
    pool = make_pool(pool_size=5)
    wait(pool, 5)
    assert pool.servers_wanted(0.0, 0.0, room_db, room_user) == expected


def test_caps_apply_to_the_reserve_too() -> None:
    pool = make_pool(pool_size=1, reserve_pool_size=5, reserve_pool_timeout=0.0)
    pool.active.add("s1")
    wait(pool, 5)
    assert pool.servers_wanted(1.0, 0.0, 2, BIG) == 2


def test_over_pool_size_after_a_shrink_wants_nothing() -> None:
    pool = make_pool(pool_size=1)
    pool.active.update({"s1", "s2", "s3"})  # pool_size lowered by a reload
    wait(pool, 3)
    assert pool.servers_wanted(0.0, 0.0, BIG, BIG) == 0


def test_first_login_for_clients_awaiting_params() -> None:
    # Clients past authentication need one server to learn its parameters from.
    pool = make_pool(pool_size=3)
    pool.awaiting_params.extend(["c1", "c2"])
    assert pool.servers_wanted(0.0, None, BIG, BIG) == 1
    pool.login.add("s1")
    assert pool.servers_wanted(0.0, None, BIG, BIG) == 0
    pool.server_params = {"server_version": "15"}
    pool.login.clear()
    assert pool.servers_wanted(0.0, None, BIG, BIG) == 0


def test_idle_servers_are_taken_last_in_first_out() -> None:
    pool = make_pool()
    for server in ("s1", "s2", "s3"):
        pool.active.add(server)
    for server in ("s1", "s2", "s3"):
        pool.put_idle(server)
    assert pool.active == set()
    assert pool.take_idle() == "s3"
    assert pool.take_idle() == "s2"
    pool.put_idle("s3")
    assert pool.take_idle() == "s3"
    assert pool.take_idle() == "s1"
    assert pool.take_idle() is None
    assert pool.active == {"s1", "s2", "s3"}


def test_a_logged_in_server_moves_out_of_login() -> None:
    pool = make_pool()
    pool.login.add("s1")
    pool.logged_in("s1")
    assert pool.login == set() and pool.active == {"s1"}
    pool.put_idle("s1")
    assert pool.active == set() and pool.idle == ["s1"]
    assert pool.server_count == 1


def test_waiters_are_served_first_in_first_out() -> None:
    pool = make_pool()
    clients = wait(pool, 4)
    pool.unqueue(clients[1])
    pool.unqueue("not-waiting")  # harmless
    assert pool.dequeue() == clients[0]
    pool.enqueue("late")
    assert [pool.dequeue() for _ in range(3)] == [clients[2], clients[3], "late"]
    assert pool.dequeue() is None


def test_forget_removes_from_everywhere() -> None:
    pool = make_pool()
    pool.idle.extend(["s1", "s2"])
    pool.active.add("s3")
    pool.login.add("s4")
    for server in ("s1", "s3", "s4", "unknown"):
        pool.forget(server)
    assert (pool.idle, pool.active, pool.login) == (["s2"], set(), set())
    assert pool.server_count == 1


class _Server:
    """A server as the pool sees it: opaque, but for its ServerState."""

    def __init__(self, state: ServerState) -> None:
        self.state = state


def test_the_idle_stack_and_server_state_agree_as_the_pooler_moves_them() -> None:
    """The pooler's moves, in its order (pooler/linking.py): FREED then put_idle, take_idle
    then LINKED, park before FREED; after each, nothing is out of step and the server is in
    one place."""
    pool = make_pool()
    server = _Server(ServerState.LOGIN)
    pool.login.add(server)
    assert pool.idle_out_of_step() == [] and pool.server_count == 1
    pool.logged_in(server)
    server.state = ServerState.IDLE  # FREED
    pool.put_idle(server)
    assert pool.idle_out_of_step() == [] and pool.listed_twice() == []
    assert pool.take_idle() is server
    server.state = ServerState.ACTIVE  # LINKED
    assert pool.idle_out_of_step() == [] and pool.listed_twice() == []
    pool.park_canceled(server)  # a cancel in flight: parked while still ACTIVE
    assert pool.idle_out_of_step() == [] and pool.listed_twice() == []
    pool.unpark(server)  # the cancel landed
    server.state = ServerState.IDLE  # FREED
    pool.put_idle(server)
    assert pool.idle_out_of_step() == [] and pool.listed_twice() == []
    assert pool.server_count == 1 and pool.idle == [server]


def test_below_counts_every_place() -> None:
    pool = make_pool()
    for place in (pool.login, pool.active, pool.being_canceled):
        place.add(_Server(ServerState.ACTIVE))
    pool.idle.append(_Server(ServerState.IDLE))
    assert pool.below(5) and not pool.below(4) and not pool.below(2)


def test_listed_twice_names_a_server_in_two_places() -> None:
    pool = make_pool()
    server = _Server(ServerState.LOGIN)
    pool.login.add(server)
    pool.active.add(server)  # taken out of neither: the slip logged_in exists to avoid
    assert pool.listed_twice() == [server]


def test_idle_out_of_step_names_each_disagreement() -> None:
    pool = make_pool()
    linked_but_stacked = _Server(ServerState.ACTIVE)
    idle_but_active = _Server(ServerState.IDLE)
    idle_but_parked = _Server(ServerState.IDLE)
    pool.idle.append(linked_but_stacked)
    pool.active.add(idle_but_active)
    pool.being_canceled.add(idle_but_parked)
    assert pool.idle_out_of_step() == [linked_but_stacked, idle_but_active, idle_but_parked]
    for server in (linked_but_stacked, idle_but_active, idle_but_parked):
        pool.forget(server)  # closed: listed nowhere, whatever its state says until it is gone
    assert pool.idle_out_of_step() == []
