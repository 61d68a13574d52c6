"""pypool's own work per transaction, without the kernel: the transaction path over fake sockets.

    python3 bench/path_cpu.py [--mode simple|extended] [--transactions N] [--rounds R]
                              [--set KEY=VALUE ...] [--cold KIB] [TREE TREE ...]
    python3 bench/path_cpu.py --instructions [--mode simple|extended] [TREE TREE ...]

Socket CPU figures (bench/cpu_per_tx.py, bench/run) carry the kernel's share, three quarters
of the pooler's CPU, and the machine's noise, several percent from run to run: a change of a
tenth of a microsecond is lost in them. This script runs the real Pooler, ClientConnection
and ServerConnection objects of the tree it is run from (compiled, or not: it says which)
over tests/net/fakes.py's fake transports and clock, with nothing but the pooler's Python on
the path, and prints nanoseconds per transaction:
- 50 clients on a pool of 20 servers, transaction mode, pipelining off (bench/cpu_per_tx.py's
  shape): each client sends pgbench -S's transaction (`-M simple`: one Query; `-M extended`:
  Parse, Bind, Describe, Execute, Sync of the unnamed statement) and, once its replies
  came, the next; each server answers what it was sent with a row, its tag and
  ReadyForQuery, as PostgreSQL 15 does. 30 clients wait in the pool's queue at any time, so
  every release hands the server on, as under pgbench.
- the same bytes through bench/relay.py's no-op relay over the same fake transports (1:1,
  no pool): what moving the bytes costs Python, the floor pypool's figure is read against;
- and through bench/pool_floor.py's pooling (the same 50 clients on 20 servers, 30 waiting,
  release on a read ending in ReadyForQuery 'I', nothing else): the least a pooler does.
  pypool's figure beyond this one is what its bookkeeping costs per transaction.

Each round is a fresh pooler, warmed up, then timed; the medians over the rounds are
printed, and the fastest rounds (noise only ever adds time: on a shared machine the
medians move by a tenth from run to run, the fastest rounds by a few percent). `--set`
overrides a [pgbouncer] key (`--set max_prepared_statements=0`), so one run with and one
without a feature gives that feature's cost on the common path. With TREEs
(pypool source trees, compiled in place or not), each round runs each tree in turn in a
process of its own, alternating, and prints each tree's figures: a change, tree against
tree. Run it under `perf record` for a profile of pypool's own code alone (bench/README.md).

`--instructions` counts instead of timing: each part (pypool, and the relay and the floor
once) runs under valgrind's callgrind at two transaction counts, and the difference is the
instructions one transaction costs, the same from run to run to within a few tenths of a
percent however loaded the machine is (a timed round moves by a tenth here). The harness's
own Python is in the count, the same for every tree: compare trees with it. Needs valgrind.

Over fakes, everything pypool touches stays in the caches from one transaction to the next;
in a real run the kernel's socket work and the other processes push it out between each
read and write. `--cold 256` pushes 256 KiB through the caches after every transaction
(in every column alike), which brings pypool's figure beyond the floor's to what a real
run's user time shows (bench/README.md): its cost is the code and objects it touches.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The tree measured: this script's own, or the one a tree-against-tree run names.
sys.path.insert(0, os.environ.get("PATH_CPU_TREE") or str(HERE.parent))
sys.path.insert(0, str(HERE))

import pool_floor  # noqa: E402  (bench/pool_floor.py)
import relay  # noqa: E402  (bench/relay.py)

from pypool import compiled  # noqa: E402
from pypool.protocol import messages as m  # noqa: E402
from tests.net import fakes  # noqa: E402

CLIENTS, POOL_SIZE = 50, 20
QUERY_TEXT = "SELECT abalance FROM pgbench_accounts WHERE aid = 51234;"
# What PostgreSQL 15 reports at a login (fakes.log_in sends these), with the clients'
# application_name already set, as on every server after its first transaction under pgbench.
SERVER_PARAMS = {
    "application_name": "pgbench", "client_encoding": "UTF8", "DateStyle": "ISO, MDY",
    "default_transaction_read_only": "off", "in_hot_standby": "off",
    "integer_datetimes": "on", "IntervalStyle": "postgres", "is_superuser": "off",
    "server_encoding": "UTF8", "server_version": "15.18", "session_authorization": "app",
    "standard_conforming_strings": "on", "TimeZone": "UTC",
}


def requests(mode: str) -> bytes:
    """One pgbench -S transaction, as the client sends it."""
    if mode == "simple":
        return m.query(QUERY_TEXT)
    text = b"SELECT abalance FROM pgbench_accounts WHERE aid = $1;"
    parse = m.message(ord("P"), b"\x00" + text + b"\x00" + struct.pack("!HI", 1, 23))
    value = b"51234"
    bind = m.message(ord("B"), b"\x00\x00" + struct.pack("!HHI", 0, 1, len(value)) + value
                     + struct.pack("!H", 0))
    return parse + bind + m.describe_portal() + m.execute() + m.sync()


def replies(mode: str) -> bytes:
    """PostgreSQL's answer to it."""
    row = (m.row_description([("abalance", 23)]) + m.data_row(["0"])
           + m.command_complete("SELECT 1") + m.ready_for_query())
    if mode == "simple":
        return row
    return m.parse_complete() + m.message(ord("2")) + row  # ParseComplete, BindComplete


class QuietTransport(fakes.FakeTransport):
    """A fake transport whose write is a C function that keeps nothing, as uvloop's write is
    C: the timed loop pays for no test bookkeeping."""

    def __init__(self) -> None:
        super().__init__()
        self.write = collections.deque(maxlen=0).append  # type: ignore[method-assign]


def pooler_round(mode: str, transactions: int, keys: dict[str, Any]) -> float:
    """Nanoseconds per transaction through a fresh pooler."""
    fake, servers = pooler_serving(mode, keys)
    try:
        ns = _timed(_serving(servers, requests(mode), replies(mode)), transactions)
        stats = fake.pool().stats
        assert stats.xact_count >= transactions, stats.xact_count
        return ns
    finally:
        fake.close()


def pooler_serving(mode: str, keys: dict[str, Any]) -> tuple[Any, list[Any]]:
    """A fresh pooler over fakes in the steady state: 50 clients, 20 of them linked to the
    pool's 20 servers, each having sent its transaction, 30 waiting. Returns the fake
    pooler (tests/net/fakes.py; close it after) and the servers."""
    settings = {"default_pool_size": POOL_SIZE, "pipeline_depth": 0, **keys}
    fake = fakes.FakePooler(fakes.make_settings(**settings))
    fake.pooler.now = time.monotonic  # the real clock, as in pypool
    request = requests(mode)
    first = fake.connect(application_name="pgbench")
    fake.open_servers(**SERVER_PARAMS)  # the pool's first server: the welcome
    clients = [first.conn] + [fake.connect(application_name="pgbench").conn
                              for _ in range(CLIENTS - 1)]
    for client in clients:
        client.transport = QuietTransport()
    # Every client sends its transaction: the pool opens its other servers, then 20
    # clients hold one and 30 wait.
    for client in clients:
        client.data_received(request)
    fake.open_servers(**SERVER_PARAMS)
    pool = fake.pool()
    servers = [*pool.active]
    assert len(servers) == POOL_SIZE and len(pool.waiting) == CLIENTS - POOL_SIZE
    for server in servers:
        server.transport = QuietTransport()
    return fake, servers


def _serving(servers: list[Any], request: bytes, reply: bytes,
             after: Callable[[], None] | None = None) -> Any:
    """`run(count)`: `count` transactions, each linked server in turn answering its client,
    which goes to the next in line, and that client sending its next transaction; `after`
    (else `--cold`'s eviction, if any) is called after each (objects_per_tx.py counts
    there)."""
    evict = after if after is not None else EVICT

    def run(count: int) -> None:
        done = 0
        while done < count:
            for server in servers:
                client = server.client
                if client is None:
                    continue
                server.data_received(reply)  # its replies; the server goes to the next
                client.data_received(request)  # and it sends its next transaction
                done += 1
                if evict is not None:
                    evict()

    return run


# `--cold KIB`: after every transaction, one write to each cache line of a KIB buffer, as
# the kernel's socket work and PostgreSQL's and pgbench's processes push the pooler's code
# and objects out of the cores' caches between its reads and writes in a real run. Every
# figure then carries the same cost of the eviction itself: read them against one another
# (pypool against the pooling floor, a tree against a tree), not alone.
EVICT: Callable[[], None] | None = None


def cold(kib: int) -> None:
    """Make EVICT push `kib` KiB of other data through the caches."""
    global EVICT
    lines = memoryview(bytearray(kib * 1024))[::64]
    ones = b"\x01" * len(lines)

    def evict() -> None:
        lines[:] = ones

    EVICT = evict


def _timed(run: Any, transactions: int) -> float:
    """Nanoseconds per transaction of `run(transactions)`, after a tenth as a warm-up, with
    the heap frozen as pypool freezes it once it has started (cli.py)."""
    run(transactions // 10)
    gc.collect()
    gc.freeze()
    try:
        start = time.perf_counter_ns()
        run(transactions)
        return (time.perf_counter_ns() - start) / transactions
    finally:
        gc.unfreeze()


def relay_round(mode: str, transactions: int) -> float:
    """Nanoseconds per transaction through bench/relay.py's sides over the same fakes."""
    pairs = []
    evict = EVICT
    for _ in range(CLIENTS):
        client, server = relay.Side(), relay.Side()
        client.connection_made(QuietTransport())  # type: ignore[arg-type]
        server.connection_made(QuietTransport())  # type: ignore[arg-type]
        client.other, server.other = server, client
        pairs.append((client, server))
    request, reply = requests(mode), replies(mode)

    def run(count: int) -> None:
        done = 0
        while done < count:
            for client, server in pairs:
                server.data_received(reply)
                client.data_received(request)
                done += 1
                if evict is not None:
                    evict()

    return _timed(run, transactions)


def floor_round(mode: str, transactions: int) -> float:
    """Nanoseconds per transaction through bench/pool_floor.py's pooling over the same fakes
    and the same shape (50 clients on 20 servers, 30 waiting)."""
    return _timed(_serving(floor_serving(mode), requests(mode), replies(mode)), transactions)


def floor_serving(mode: str) -> list[Any]:
    """bench/pool_floor.py's pooling in the same steady state as `pooler_serving`: its
    servers."""
    pool = pool_floor.Pool()
    servers = [pool_floor.Server(pool) for _ in range(POOL_SIZE)]
    for server in servers:
        server.connection_made(QuietTransport())  # type: ignore[arg-type]
    pool.idle.extend(servers)
    clients = []
    for _ in range(CLIENTS):
        client = pool_floor.Client(pool)
        client.connection_made(QuietTransport())  # type: ignore[arg-type]
        client.started = True  # logged in
        clients.append(client)
    request = requests(mode)
    for client in clients:
        client.data_received(request)
    return servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="simple", choices=["simple", "extended"])
    parser.add_argument("--transactions", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a [pgbouncer] key for the pooler (repeatable)")
    parser.add_argument("--cold", type=int, default=0, metavar="KIB",
                        help="push KIB of other data through the caches after every "
                             "transaction, as a real run's kernel and other processes do "
                             "(each figure then carries that cost: compare them)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per transaction under callgrind instead of "
                             "timing (deterministic; needs valgrind)")
    parser.add_argument("--only", choices=PARTS, help=argparse.SUPPRESS)  # one part, once
    parser.add_argument("trees", nargs="*", help="pypool trees to measure against each other")
    args = parser.parse_args()
    if args.instructions:
        return instructions(args)
    if args.cold:
        cold(args.cold)
    if args.only:
        return only(args)
    if args.trees:
        return compare(args)
    keys = _keys(args.set)
    print(f"pypool from {Path(compiled.__file__).parent.parent}, hot path "
          f"{compiled.status}; -M {args.mode}, "
          f"{CLIENTS} clients on {POOL_SIZE} servers, {args.transactions} transactions a round"
          + (f", {args.cold} KiB through the caches after each" if args.cold else "")
          + (f"; {keys}" if keys else ""))
    pooler, relayed, floor = [], [], []
    for _ in range(args.rounds):
        pooler.append(pooler_round(args.mode, args.transactions, keys))
        relayed.append(relay_round(args.mode, args.transactions))
        floor.append(floor_round(args.mode, args.transactions))
        print(f"  pypool {pooler[-1]:7.0f} ns   relay {relayed[-1]:5.0f} ns   pooling floor "
              f"{floor[-1]:5.0f} ns per transaction", flush=True)
    p, r, f = statistics.median(pooler), statistics.median(relayed), statistics.median(floor)
    print(f"medians: pypool {p:.0f} ns, relay {r:.0f} ns, pooling floor {f:.0f} ns per "
          f"transaction; pypool's own work {p - r:.0f} ns beyond the relay's, {p - f:.0f} ns "
          "beyond the pooling floor's")
    # The machine's noise only ever adds: the fastest round is the steadiest figure.
    print(f"fastest rounds: pypool {min(pooler):.0f} ns, relay {min(relayed):.0f} ns, "
          f"pooling floor {min(floor):.0f} ns")


PARTS = ("pypool", "relay", "floor")
# Transaction counts for the two callgrind runs (each also runs a tenth more as warm-up).
COUNTED = (2_000, 6_000)


def only(args: argparse.Namespace) -> None:
    """One part, one round, what --instructions counts: prints only, for pypool's part, how
    it runs (the relay and the floor do not run pypool's compiled code)."""
    keys = _keys(args.set)
    if args.only == "pypool":
        print(compiled.status)
        pooler_round(args.mode, args.transactions, keys)
    elif args.only == "relay":
        relay_round(args.mode, args.transactions)
    else:
        floor_round(args.mode, args.transactions)


def _callgrind(tree: str, part: str, args: argparse.Namespace, transactions: int) -> int:
    """Instructions callgrind counted for one process running `part` once."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, __file__, "--only", part, "--mode", args.mode,
               "--transactions", str(transactions)]
    command += [f"--set={item}" for item in args.set]
    # One hash seed for every run: string hashes decide how sets and dicts probe, which
    # moved the count by over a percent between runs of the same tree.
    done = subprocess.run(command, env={**os.environ, "PATH_CPU_TREE": tree,
                                        "PYTHONHASHSEED": "0"},
                          capture_output=True, text=True, check=True)
    if "pure Python" in done.stdout:
        print(f"  {tree}: {done.stdout.strip()}")
    counted = [line for line in done.stderr.splitlines() if "Collected :" in line]
    return int(counted[-1].split()[-1])


def instructions(args: argparse.Namespace) -> None:
    """Instructions per transaction: pypool of each tree (this checkout if none), then the
    relay's and the floor's, from two callgrind runs each."""
    few, many = COUNTED
    per = (many - few) * 1.1  # each run warms up on a tenth more first (`_timed`)
    trees = args.trees or [str(HERE.parent)]
    print(f"-M {args.mode}: instructions per transaction (callgrind; the harness's own "
          "included, the same in every row)")
    first = 0.0
    for tree in trees:
        count = (_callgrind(tree, "pypool", args, many)
                 - _callgrind(tree, "pypool", args, few)) / per
        first = first or count
        print(f"  pypool {tree:40s} {count:8.0f}  {count / first:.3f}x the first",
              flush=True)
    for part in ("relay", "floor"):
        count = (_callgrind(trees[0], part, args, many)
                 - _callgrind(trees[0], part, args, few)) / per
        print(f"  {part:47s} {count:8.0f}", flush=True)


def _keys(items: list[str]) -> dict[str, Any]:
    keys: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        keys[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    return keys


def compare(args: argparse.Namespace) -> None:
    """Each tree in turn, one round in a process of its own, `args.rounds` times."""
    results: dict[str, list[float]] = {tree: [] for tree in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            command = [sys.executable, __file__, "--rounds", "1", "--mode", args.mode,
                       "--transactions", str(args.transactions), "--cold", str(args.cold)]
            command += [f"--set={item}" for item in args.set]
            out = subprocess.run(command, env={**os.environ, "PATH_CPU_TREE": tree},
                                 capture_output=True, text=True, check=True).stdout
            if "NOT" in out.splitlines()[0] or "pure Python" in out.splitlines()[0]:
                print(f"  {tree}: {out.splitlines()[0]}")
            ns = float(out.splitlines()[-1].split()[3])
            results[tree].append(ns)
            print(f"  {tree:32s} {ns:7.0f} ns per transaction", flush=True)
    first = min(results[args.trees[0]])
    for tree, runs in results.items():
        print(f"{tree:32s} fastest {min(runs):6.0f} ns, median {statistics.median(runs):6.0f} ns;"
              f" {min(runs) / first:.3f}x the first tree's fastest")


if __name__ == "__main__":
    main()
