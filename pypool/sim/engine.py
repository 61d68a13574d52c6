"""The simulation: pypool's own sans-IO Pool and policies, driven by a virtual clock.

Theory of operation. Events (an arrival, a server's login done, a transaction's end, a
query_wait_timeout) sit in a heap by virtual time. Each is handled as pooler/linking.py
handles its real counterpart, and with the same Pool (pooling/pool.py) and the same policy
objects (pooling/policies.py):
- an arrival takes an idle server (`Pool.take_idle`, the server policy's choice) or is
  queued (`Pool.enqueue`), and the pool is asked how many servers to open
  (`Pool.servers_wanted`, the same call, with pool_size and the reserve pool);
- a login done, or a transaction's end, hands the server to the next waiting client
  (`Pool.dequeue`, the queue policy's choice), else puts it idle (`Pool.put_idle`);
- query_wait_timeout takes a client still queued out of the queue (`Pool.unqueue`).
What the real pooler adds (the protocol, prepared statements, pipelining, cancel) is not
simulated: a transaction is its arrival time and its service time (how long it holds a
server, the log's xact_us).

Each finished transaction or failed wait becomes a line shaped as the transaction log's
(observe/txlog.py: kind, *_us times, wait_us, xact_us, outcome, ...), so one report
(observe/txlog_file.py) reads both. Sans-IO and deterministic: a seed gives the same run.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..pooling.pool import Pool, PoolLimits

ARRIVE, LOGGED_IN, RELEASE, WAIT_TIMEOUT = 0, 1, 2, 3


@dataclass(frozen=True)
class Arrival:
    """One transaction to run: when it arrives, how long it holds a server, and who."""

    at: float  # seconds from the start
    service: float  # seconds
    user: str = "app"
    application_name: str = ""


@dataclass(eq=False)
class SimClient:
    """What a policy may read of a client (pooling/policies.py): user, params, wait_start."""

    id: int
    arrival: Arrival
    user: str
    params: dict[str, str]
    queue_on_arrival: int = 0
    wait_start: float = 0.0
    assigned: float = -1.0
    waiting: bool = False


@dataclass(eq=False)
class SimServer:
    """What a server policy may read: id, request_time, connect_time."""

    id: int
    connect_time: float
    request_time: float = 0.0
    served: int = 0


@dataclass
class SimConfig:
    pool_size: int = 20
    min_pool_size: int = 0  # servers opened (and logged in) before the first arrival
    reserve_pool_size: int = 0
    reserve_pool_timeout: float = 5.0
    connect_time: float = 0.005  # seconds a server takes to connect and log in
    query_wait_timeout: float = 0.0  # 0: clients wait for ever
    queue_policy: Any = None  # pooling/policies.py objects; None: fifo / lifo inline
    server_policy: Any = None
    queue_policy_name: str = "fifo"
    server_policy_name: str = "lifo"


@dataclass
class Simulation:
    config: SimConfig
    pool: Pool = field(init=False)
    now: float = 0.0
    lines: list[dict[str, Any]] = field(default_factory=list)
    _events: list[tuple[float, int, int, Any]] = field(default_factory=list)
    _seq: int = 0
    _ids: int = 0

    def __post_init__(self) -> None:
        cfg = self.config
        self.pool = Pool("sim", "sim", PoolLimits(
            pool_size=cfg.pool_size, min_pool_size=cfg.min_pool_size,
            reserve_pool_size=cfg.reserve_pool_size,
            reserve_pool_timeout=cfg.reserve_pool_timeout, pool_mode="transaction",
        ), cfg.queue_policy, cfg.server_policy)
        for _ in range(min(cfg.min_pool_size, cfg.pool_size)):
            server = self._new_server()
            self.pool.put_idle(server)

    # --- running --------------------------------------------------------------------------

    def run(self, arrivals: Iterable[Arrival]) -> list[dict[str, Any]]:
        for arrival in arrivals:
            self._push(arrival.at, ARRIVE, arrival)
        while self._events:
            at, _, kind, what = heapq.heappop(self._events)
            self.now = at
            if kind == ARRIVE:
                self._arrive(what)
            elif kind == RELEASE:
                self._release(*what)
            elif kind == LOGGED_IN:
                self.pool.login.discard(what)
                self._server_available(what)
            else:
                self._wait_timeout(what)
        return self.lines

    def _push(self, at: float, kind: int, what: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, what))

    def _new_server(self) -> SimServer:
        self._ids += 1
        return SimServer(self._ids, connect_time=self.now, request_time=self.now)

    # --- as pooler/linking.py -------------------------------------------------------------

    def _arrive(self, arrival: Arrival) -> None:
        self._ids += 1
        pool = self.pool
        params = {"application_name": arrival.application_name}
        client = SimClient(self._ids, arrival, arrival.user, params,
                           queue_on_arrival=len(pool.waiting))
        server = pool.take_idle()
        if server is not None:
            self._link(client, server)
            return
        client.wait_start = self.now
        client.waiting = True
        pool.enqueue(client)
        if self.config.query_wait_timeout:
            self._push(self.now + self.config.query_wait_timeout, WAIT_TIMEOUT, client)
        self._launch_servers()

    def _launch_servers(self) -> None:
        pool = self.pool
        oldest = pool.waiting[0].wait_start if pool.waiting else None
        for _ in range(pool.servers_wanted(self.now, oldest, 1 << 30, 1 << 30)):
            server = self._new_server()
            pool.login.add(server)
            self._push(self.now + self.config.connect_time, LOGGED_IN, server)

    def _link(self, client: SimClient, server: SimServer) -> None:
        client.waiting = False
        client.assigned = self.now
        self.pool.login.discard(server)
        self.pool.active.add(server)
        server.request_time = self.now
        self._push(self.now + client.arrival.service, RELEASE, (client, server))

    def _release(self, client: SimClient, server: SimServer) -> None:
        server.served += 1
        self._line(client, server, "commit")
        self._server_available(server)

    def _server_available(self, server: SimServer) -> None:
        server.request_time = self.now
        pool = self.pool
        while (client := pool.dequeue()) is not None:
            if client.waiting:
                self._link(client, server)
                return
        pool.put_idle(server)

    def _wait_timeout(self, client: SimClient) -> None:
        if not client.waiting:
            return
        client.waiting = False
        self.pool.unqueue(client)
        self._line(client, None, "query_wait_timeout")

    # --- the lines, as the transaction log writes them ------------------------------------

    def _line(self, client: SimClient, server: SimServer | None, outcome: str) -> None:
        arrival_us = round(client.arrival.at * 1e6)
        end_us = round(self.now * 1e6)
        assigned_us = round(client.assigned * 1e6) if client.assigned >= 0 else None
        cfg = self.config
        self.lines.append({
            "kind": "transaction" if server is not None else "wait",
            "arrival_us": arrival_us, "assigned_us": assigned_us, "released_us": end_us,
            "wait_us": (assigned_us if assigned_us is not None else end_us) - arrival_us,
            "xact_us": end_us - assigned_us if assigned_us is not None else None,
            "client_id": client.id, "user": client.user, "database": "sim",
            "application_name": client.arrival.application_name,
            "server_id": server.id if server is not None else None,
            "outcome": outcome, "queue_on_arrival": client.queue_on_arrival,
            "queue_policy": cfg.queue_policy_name, "server_policy": cfg.server_policy_name,
        })


def simulate(arrivals: Iterable[Arrival], config: SimConfig) -> list[dict[str, Any]]:
    """Run `arrivals` through a pool configured by `config`; the lines, in end order."""
    return Simulation(config).run(arrivals)
