"""Queue and server policies: which waiting client is served next, which idle server goes.

A pool (pooling/pool.py) keeps its waiting clients in arrival order (oldest first) and its
idle servers in the order they became idle (most recent last), whatever the policy: the
janitor's query_wait_timeout, query_wait_notify, server_idle_timeout and SHOW read those
orders. A policy only *chooses* from them:

    class QueuePolicy:                      class ServerPolicy:
        name: str                               name: str
        def take(self, waiting) -> client       def take(self, idle) -> server

`take` is called with a non-empty `collections.deque` (waiting clients) or `list` (idle
servers); it removes the one it chooses and returns it. It must not reorder what it leaves,
and must not block or do I/O: it runs on the hot path of every assignment. A client
exposes `.user`, `.params` (its session parameters: `params.get("application_name")`) and
`.wait_start` (monotonic seconds); a server `.id`, `.request_time` (when it was last freed
or assigned) and `.connect_time`. One policy object is made per pool (from a class called
with no arguments, or the built-in's own arguments), so it may keep state (round-robin).

The defaults, fifo and lifo, are not called at all: the pool does `popleft()` and `pop()`
inline, as it did before policies existed (`Pool.queue_policy` and `Pool.server_policy`
are None), so the compiled hot path keeps its speed. Anything else is named in the ini
(`queue_policy`, `server_policy`) by one of the names below or as `module:Class`, a
researcher's own class importable from PYTHONPATH.

This module is sans-IO: it chooses, it never touches a connection.
"""

from __future__ import annotations

import importlib
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

QUEUE_POLICIES = ("fifo", "lifo", "priority", "round_robin")
SERVER_POLICIES = ("lifo", "fifo", "lru", "round_robin")
DEFAULT_QUEUE_POLICY = "fifo"
DEFAULT_SERVER_POLICY = "lifo"


class QueuePolicy(Protocol):
    """Chooses which waiting client is served next."""

    name: str

    def take(self, waiting: deque[Any]) -> Any: ...


class ServerPolicy(Protocol):
    """Chooses which idle server is handed out."""

    name: str

    def take(self, idle: list[Any]) -> Any: ...


# --- queue policies ------------------------------------------------------------------------


class FifoQueue:
    """First come, first served (the default; the pool does this inline)."""

    name = "fifo"

    def take(self, waiting: deque[Any]) -> Any:
        return waiting.popleft()


class LifoQueue:
    """Last come, first served: the newest waiter goes first (short waits for most, a long
    tail for the unlucky; a classic under overload, where the oldest have given up)."""

    name = "lifo"

    def take(self, waiting: deque[Any]) -> Any:
        return waiting.pop()


class PriorityQueue:
    """The waiter with the highest weight goes first, oldest first among equals.

    `by` is "user" or "application_name"; `weights` maps its values to integers (unlisted
    values weigh 0). From the ini: `queue_priority = application_name: web=10, batch=-5`.
    """

    name = "priority"

    def __init__(self, by: str = "application_name",
                 weights: dict[str, int] | None = None) -> None:
        self.by = by
        self.weights = weights or {}

    def weight(self, client: Any) -> int:
        key = client.user if self.by == "user" else client.params.get("application_name", "")
        return self.weights.get(key, 0)

    def take(self, waiting: deque[Any]) -> Any:
        best = 0
        best_weight = self.weight(waiting[0])
        for index in range(1, len(waiting)):
            weight = self.weight(waiting[index])
            if weight > best_weight:
                best, best_weight = index, weight
        client = waiting[best]
        del waiting[best]
        return client


class RoundRobinQueue:
    """Take turns between users: the oldest waiter of the next user (in name order) after
    the one served last, so one user's burst cannot hold the others back. Useful where one
    pool serves many users (a [databases] entry with `user=`)."""

    name = "round_robin"

    def __init__(self) -> None:
        self.last_user: str | None = None

    def take(self, waiting: deque[Any]) -> Any:
        chosen = -1
        first = -1  # the oldest waiter of the smallest user name, if nobody comes after
        for index, client in enumerate(waiting):
            user = client.user
            if self.last_user is not None and user > self.last_user and (
                chosen < 0 or user < waiting[chosen].user
            ):
                chosen = index
            if first < 0 or user < waiting[first].user:
                first = index
        if chosen < 0:
            chosen = first
        client = waiting[chosen]
        del waiting[chosen]
        self.last_user = client.user
        return client


# --- server policies -----------------------------------------------------------------------


class LifoServers:
    """The most recently released server first (the default; the pool does this inline):
    few servers stay warm, the others age out through server_idle_timeout."""

    name = "lifo"

    def take(self, idle: list[Any]) -> Any:
        return idle.pop()


class FifoServers:
    """The server idle longest first, in the order they joined the idle list: load spread
    over every server, none ages out while there is work."""

    name = "fifo"

    def take(self, idle: list[Any]) -> Any:
        return idle.pop(0)


class LruServers:
    """The least recently used server (oldest `request_time`: when it was last assigned or
    freed). The same as fifo unless servers rejoin the idle list out of that order (a
    cancel in flight parks a server, a fresh login joins at the end)."""

    name = "lru"

    def take(self, idle: list[Any]) -> Any:
        best = min(range(len(idle)), key=lambda index: idle[index].request_time)
        return idle.pop(best)


class RoundRobinServers:
    """Servers in turn by id: the idle server with the next id after the one handed out
    last (wrapping round), so every connection serves in order."""

    name = "round_robin"

    def __init__(self) -> None:
        self.last_id = -1

    def take(self, idle: list[Any]) -> Any:
        chosen = -1
        first = 0
        for index, server in enumerate(idle):
            if server.id > self.last_id and (chosen < 0 or server.id < idle[chosen].id):
                chosen = index
            if server.id < idle[first].id:
                first = index
        if chosen < 0:
            chosen = first
        server = idle.pop(chosen)
        self.last_id = server.id
        return server


_QUEUE_CLASSES: dict[str, Callable[[], Any]] = {
    "fifo": FifoQueue, "lifo": LifoQueue, "round_robin": RoundRobinQueue,
}
_SERVER_CLASSES: dict[str, Callable[[], Any]] = {
    "lifo": LifoServers, "fifo": FifoServers, "lru": LruServers,
    "round_robin": RoundRobinServers,
}


# --- from the ini --------------------------------------------------------------------------


def parse_priority(text: str) -> tuple[str, dict[str, int]]:
    """`queue_priority`'s value: `application_name: web=10, batch=-5` (or `user: ...`)."""
    text = text.strip()
    if not text:
        return "application_name", {}
    by, sep, rest = text.partition(":")
    by = by.strip()
    if not sep or by not in ("user", "application_name"):
        raise ValueError("must be 'user: name=weight, ...' or "
                         "'application_name: name=weight, ...'")
    weights: dict[str, int] = {}
    for item in rest.split(","):
        if not item.strip():
            continue
        name, eq, weight = item.partition("=")
        if not eq:
            raise ValueError(f"{item.strip()!r}: expected name=weight")
        try:
            weights[name.strip()] = int(weight)
        except ValueError:
            raise ValueError(f"{item.strip()!r}: the weight must be an integer") from None
    return by, weights


def _custom(spec: str) -> Callable[[], Any]:
    module_name, _, class_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name.strip())
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name.strip()!r}: {exc}") from None
    found = getattr(module, class_name.strip(), None)
    if not callable(found) or not hasattr(found, "take"):
        raise ValueError(f"{spec!r}: no class with a take() method")
    return found  # type: ignore[no-any-return]


def queue_factory(spec: str, priority: str = "") -> Callable[[], QueuePolicy] | None:
    """What makes each pool's queue policy; None for the default (fifo, inline)."""
    spec = spec.strip()
    if spec in ("", DEFAULT_QUEUE_POLICY):
        return None
    if spec == "priority":
        by, weights = parse_priority(priority)
        return lambda: PriorityQueue(by, weights)
    if spec in _QUEUE_CLASSES:
        return _QUEUE_CLASSES[spec]
    if ":" in spec:
        return _custom(spec)
    raise ValueError(f"must be one of {', '.join(QUEUE_POLICIES)} or module:Class, not {spec!r}")


def server_factory(spec: str) -> Callable[[], ServerPolicy] | None:
    """What makes each pool's server policy; None for the default (lifo, inline)."""
    spec = spec.strip()
    if spec in ("", DEFAULT_SERVER_POLICY):
        return None
    if spec in _SERVER_CLASSES:
        return _SERVER_CLASSES[spec]
    if ":" in spec:
        return _custom(spec)
    raise ValueError(
        f"must be one of {', '.join(SERVER_POLICIES)} or module:Class, not {spec!r}")


def policy_name(policy: Any, default: str) -> str:
    """How a pool's policy reads in SHOW and the transaction log."""
    if policy is None:
        return default
    return str(getattr(policy, "name", type(policy).__name__))


# What makes each pool's queue and server policy (None: the inline default), made from the
# settings at start and on a reload that changes them (pooler/research.py).
Factories = tuple[Callable[[], QueuePolicy] | None, Callable[[], ServerPolicy] | None]
