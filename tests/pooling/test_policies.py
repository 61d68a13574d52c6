"""The queue and server policies on their own and inside a Pool: which one each chooses."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest

from pypool.pooling import policies
from pypool.pooling.pool import Pool, PoolLimits
from pypool.settings import SettingsError, pooler_settings


@dataclass(eq=False)
class Client:
    user: str
    params: dict[str, str] = field(default_factory=dict)
    wait_start: float = 0.0


@dataclass(eq=False)
class Server:
    id: int
    request_time: float = 0.0
    connect_time: float = 0.0


def limits() -> PoolLimits:
    return PoolLimits(pool_size=5, min_pool_size=0, reserve_pool_size=0,
                      reserve_pool_timeout=5.0, pool_mode="transaction")


def drain(policy: policies.QueuePolicy, clients: list[Client]) -> list[Client]:
    waiting = deque(clients)
    return [policy.take(waiting) for _ in clients]


def test_fifo_and_lifo_queues() -> None:
    a, b, c = Client("a"), Client("b"), Client("c")
    assert drain(policies.FifoQueue(), [a, b, c]) == [a, b, c]
    assert drain(policies.LifoQueue(), [a, b, c]) == [c, b, a]


def test_priority_by_user_keeps_arrival_order_among_equals() -> None:
    low1, high1, low2, high2 = Client("lo"), Client("hi"), Client("lo"), Client("hi")
    policy = policies.PriorityQueue("user", {"hi": 5})
    assert drain(policy, [low1, high1, low2, high2]) == [high1, high2, low1, low2]


def test_round_robin_between_users() -> None:
    a1, a2, a3, b1, c1 = Client("a"), Client("a"), Client("a"), Client("b"), Client("c")
    assert drain(policies.RoundRobinQueue(), [a1, a2, a3, b1, c1]) == [a1, b1, c1, a2, a3]


def test_server_policies() -> None:
    s1, s2, s3 = Server(1, 30.0), Server(2, 10.0), Server(3, 20.0)
    assert policies.LifoServers().take([s1, s2, s3]) is s3
    assert policies.FifoServers().take([s1, s2, s3]) is s1
    assert policies.LruServers().take([s1, s2, s3]) is s2
    rr = policies.RoundRobinServers()
    idle = [s3, s1, s2]
    order = []
    for _ in range(6):
        server = rr.take(idle)
        order.append(server.id)
        idle.append(server)
    assert order == [1, 2, 3, 1, 2, 3]


def test_the_pool_uses_them_and_keeps_its_orders() -> None:
    pool = Pool("db", "u", limits(), policies.LifoQueue(), policies.FifoServers())
    first, second = Server(1), Server(2)
    pool.put_idle(first)
    pool.put_idle(second)
    assert pool.take_idle() is first
    assert pool.idle == [second]
    a, b, c = Client("a"), Client("b"), Client("c")
    for client in (a, b, c):
        pool.enqueue(client)
    assert pool.dequeue() is c
    assert list(pool.waiting) == [a, b]  # still oldest first for the janitor


def test_the_defaults_are_inline() -> None:
    assert policies.queue_factory("fifo") is None
    assert policies.server_factory("lifo") is None
    pool = Pool("db", "u", limits())
    assert pool.queue_policy is None and pool.server_policy is None


def test_the_ini_names_them_and_refuses_others() -> None:
    cfg = pooler_settings({"queue_policy": "priority",
                           "queue_priority": "user: alice=3, bob=-1",
                           "server_policy": "round_robin"}, "t.ini")
    make = policies.queue_factory(cfg.queue_policy, cfg.queue_priority)
    assert make is not None
    made = make()
    assert isinstance(made, policies.PriorityQueue)
    assert made.by == "user" and made.weights == {"alice": 3, "bob": -1}
    for key, value in (("queue_policy", "random"), ("server_policy", "mru"),
                       ("queue_priority", "host: a=1"), ("queue_priority", "user: a=x"),
                       ("queue_policy", "no_such_module_here:Thing")):
        with pytest.raises(SettingsError, match=key):
            pooler_settings({key: value}, "t.ini")
