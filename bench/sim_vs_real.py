"""The simulator against a real run: the same load through pypool and through pypool.sim.

    python3 bench/sim_vs_real.py [--pool-size 4] [--rate 150] [--mean-ms 20] [--seconds 20]
        [--queue-policy NAME|module:Class] [--queue-priority ...] [--apps web=0.5,batch=0.5]

Starts a throwaway PostgreSQL and a pypool in front of it (this tree, transaction mode,
`transaction_log` on, pool_size = min_pool_size = --pool-size), then offers an open-loop
load: Poisson arrivals at --rate per second, each a `SELECT pg_sleep(s)` with s drawn
exponential with mean --mean-ms, sent on whichever of --connections client connections is
free. Then it simulates, with pypool's own pool (pypool/sim/):
- `replay`: the log's own arrivals and service times (xact_us), the pool at its size:
  any difference is the simulator's, not the load's;
- `synthetic`: fresh Poisson arrivals and exponential service (M/M/c) at the arrival rate
  and with the mean service time the log measured: the textbook model's prediction;
and prints the three wait distributions and the relative differences of the mean wait
(with --apps, also each application's real and replayed waits: a queue policy measured for
real and in the simulator).
docs/research.md states the margin found on this machine; tests/integration/test_sim_vs_real.py
runs a short version and asserts it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pypool.observe.distribution import Summary, summarise, table  # noqa: E402
from pypool.observe.txlog_file import read_lines  # noqa: E402
from pypool.pooling import policies  # noqa: E402
from pypool.sim import SimConfig, replay, service_sampler, simulate, synthetic  # noqa: E402

APP = "sim-vs-real"


async def offered_load(dsn: str, rate: float, mean_ms: float, seconds: float,
                       connections: int = 40, seed: int = 1,
                       apps: Sequence[tuple[str, float]] = ()) -> int:
    """Open-loop Poisson load; returns how many arrivals found no free client connection
    (they start late, which the log records as their arrival: the comparison still holds).
    `apps`: application_name shares (each arrival drawn among them, each name with its own
    `connections` client connections); none: all are APP."""
    import psycopg

    names = [name for name, _ in apps] or [APP]
    shares = [share for _, share in apps] or [1.0]
    free: dict[str, asyncio.Queue[Any]] = {}
    conns = []
    for name in names:
        free[name] = asyncio.Queue()
        for _ in range(connections):
            conn = await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, prepare_threshold=None, application_name=name)
            conns.append(conn)
            free[name].put_nowait(conn)
    rng = random.Random(seed)
    late = 0
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2
    tasks = []

    async def one(at: float, service: float, name: str) -> None:
        nonlocal late
        await asyncio.sleep(max(0.0, at - loop.time()))
        if free[name].empty():
            late += 1
        conn = await free[name].get()
        try:
            await conn.execute(f"SELECT pg_sleep({service:.6f})")
        finally:
            free[name].put_nowait(conn)

    at = start
    while at < start + seconds:
        at += rng.expovariate(rate)
        name = rng.choices(names, shares)[0]
        tasks.append(asyncio.create_task(one(at, rng.expovariate(1000 / mean_ms), name)))
    await asyncio.gather(*tasks)
    for conn in conns:
        await conn.close()
    return late


def sim_config(pool_size: int, queue_policy: str = "fifo", queue_priority: str = ""
               ) -> SimConfig:
    make = policies.queue_factory(queue_policy, queue_priority)
    return SimConfig(pool_size=pool_size, min_pool_size=pool_size,
                     queue_policy=None if make is None else make(),
                     queue_policy_name=queue_policy)


def compare(log_path: str | Path, pool_size: int, rate: float, seed: int = 2,
            queue_policy: str = "fifo", queue_priority: str = "",
            apps: Sequence[str] = (APP,)) -> dict[str, Summary]:
    """The real waits and the two simulations' (see the module docstring), and with
    several `apps` the real and replayed waits of each ("real <app>", "replay <app>")."""
    lines = [r for r in read_lines(log_path) if r["application_name"] in apps]
    served = [r["xact_us"] for r in lines if r["xact_us"] is not None]
    mean_service = sum(served) / len(served) / 1e6
    replayed = simulate(replay(lines), sim_config(pool_size, queue_policy, queue_priority))
    # The arrival rate the pooler saw (the load generator's own lags a little behind).
    span = (max(r["arrival_us"] for r in lines) - min(r["arrival_us"] for r in lines)) / 1e6
    measured_rate = (len(lines) - 1) / span if span > 0 else rate
    rng = random.Random(seed)
    fresh = synthetic(len(lines) * 10, measured_rate,
                      service_sampler("exponential", mean_service, rng), rng)
    modelled = simulate(fresh, sim_config(pool_size, queue_policy, queue_priority))
    result = {
        "real": summarise(r["wait_us"] for r in lines),
        "replay": summarise(r["wait_us"] for r in replayed),
        "synthetic": summarise(r["wait_us"] for r in modelled),
        "service": summarise(served),
    }
    if len(apps) > 1:
        for app in apps:
            result[f"real {app}"] = summarise(
                r["wait_us"] for r in lines if r["application_name"] == app)
            result[f"replay {app}"] = summarise(
                r["wait_us"] for r in replayed if r["application_name"] == app)
    return result


def margins(result: dict[str, Summary]) -> dict[str, float]:
    """Relative difference of each simulation's mean wait from the real one."""
    real = result["real"].mean
    return {name: (result[name].mean - real) / real for name in ("replay", "synthetic")}


def print_result(result: dict[str, Summary]) -> None:
    names = ["real", "replay", "synthetic"] + sorted(
        name for name in result if " " in name)
    print(table([(f"wait {name}", result[name]) for name in names]
                + [("service (real)", result["service"])]))
    for name, diff in margins(result).items():
        print(f"mean wait, {name} vs real: {diff:+.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--mean-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=40,
                        help="client connections (per application name)")
    parser.add_argument("--queue-policy", default="fifo",
                        help="as the ini's; a module:Class is imported from the current "
                             "directory")
    parser.add_argument("--queue-priority", default="")
    parser.add_argument("--apps", default="",
                        help="application_name shares, e.g. web=0.5,batch=0.5")
    parser.add_argument("--keep-log", metavar="PATH", help="copy the transaction log here")
    args = parser.parse_args()
    sys.path.append(os.getcwd())  # a researcher's module:Class, as the pooler finds it
    apps = []
    for item in filter(None, args.apps.split(",")):
        name, _, share = item.partition("=")
        apps.append((name.strip(), float(share or 1)))

    from pypool.embedded import EmbeddedPostgres, free_port

    work = Path(tempfile.mkdtemp(prefix="pypool-sim-"))
    pg = EmbeddedPostgres()
    pg.start()
    try:
        pg.create_role("app", "app-secret")
        pg.execute("CREATE DATABASE app OWNER app")
        port = free_port()
        log_path = work / "tx.jsonl"
        (work / "users.txt").write_text('"app" "app-secret"\n')
        (work / "pypool.ini").write_text(
            f"[databases]\napp = host={pg.host} port={pg.port} dbname=app\n\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
            f"unix_socket_dir =\nauth_type = scram-sha-256\nauth_file = {work}/users.txt\n"
            f"pool_mode = transaction\ndefault_pool_size = {args.pool_size}\n"
            f"min_pool_size = {args.pool_size}\nmax_client_conn = 1000\n"
            f"transaction_log = {log_path}\nlog_connections = 0\nlog_disconnections = 0\n"
            f"queue_policy = {args.queue_policy}\nqueue_priority = {args.queue_priority}\n")
        # This tree's pypool; a researcher's policy module from the current directory.
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.getcwd()])}
        proc = subprocess.Popen([sys.executable, "-m", "pypool", str(work / "pypool.ini")],
                                cwd=HERE.parent, stdout=subprocess.DEVNULL, env=env)
        try:
            time.sleep(1.5)
            dsn = f"postgresql://app:app-secret@127.0.0.1:{port}/app"
            late = asyncio.run(offered_load(dsn, args.rate, args.mean_ms, args.seconds,
                                            args.connections, apps=apps))
            time.sleep(0.5)
        finally:
            proc.terminate()
            proc.wait(10)
        print(f"pool_size {args.pool_size}, queue_policy {args.queue_policy}, Poisson "
              f"{args.rate:g}/s, exponential {args.mean_ms:g} ms, {args.seconds:g} s; "
              f"{late} arrivals started late")
        print_result(compare(log_path, args.pool_size, args.rate, 2, args.queue_policy,
                             args.queue_priority, [name for name, _ in apps] or [APP]))
        if args.keep_log:
            shutil.copyfile(log_path, args.keep_log)
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
