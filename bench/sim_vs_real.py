"""The simulator against a real run: the same load through pypool and through pypool.sim.

    python3 bench/sim_vs_real.py [--pool-size 4] [--rate 150] [--mean-ms 20] [--seconds 20]

Starts a throwaway PostgreSQL and a pypool in front of it (this tree, transaction mode,
`transaction_log` on, pool_size = min_pool_size = --pool-size), then offers an open-loop
load: Poisson arrivals at --rate per second, each a `SELECT pg_sleep(s)` with s drawn
exponential with mean --mean-ms, sent on whichever of --connections client connections is
free. Then it simulates, with pypool's own pool (pypool/sim/):
- `replay`: the log's own arrivals and service times (xact_us), the pool at its size:
  any difference is the simulator's, not the load's;
- `synthetic`: fresh Poisson arrivals and exponential service (M/M/c) at the arrival rate
  and with the mean service time the log measured: the textbook model's prediction;
and prints the three wait distributions and the relative differences of the mean wait.
docs/research.md states the margin found on this machine; tests/integration/test_sim_vs_real.py
runs a short version and asserts it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pypool.observe.distribution import Summary, summarise, table  # noqa: E402
from pypool.observe.txlog_file import read_lines  # noqa: E402
from pypool.sim import SimConfig, replay, service_sampler, simulate, synthetic  # noqa: E402

APP = "sim-vs-real"


async def offered_load(dsn: str, rate: float, mean_ms: float, seconds: float,
                       connections: int = 40, seed: int = 1) -> int:
    """Open-loop Poisson load; returns how many arrivals found no free client connection
    (they start late, which the log records as their arrival: the comparison still holds)."""
    import psycopg

    conns = [await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=None, application_name=APP)
        for _ in range(connections)]
    free: asyncio.Queue[Any] = asyncio.Queue()
    for conn in conns:
        free.put_nowait(conn)
    rng = random.Random(seed)
    late = 0
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2
    tasks = []

    async def one(at: float, service: float) -> None:
        nonlocal late
        await asyncio.sleep(max(0.0, at - loop.time()))
        if free.empty():
            late += 1
        conn = await free.get()
        try:
            await conn.execute(f"SELECT pg_sleep({service:.6f})")
        finally:
            free.put_nowait(conn)

    at = start
    while at < start + seconds:
        at += rng.expovariate(rate)
        tasks.append(asyncio.create_task(one(at, rng.expovariate(1000 / mean_ms))))
    await asyncio.gather(*tasks)
    for conn in conns:
        await conn.close()
    return late


def compare(log_path: str | Path, pool_size: int, rate: float, seed: int = 2
            ) -> dict[str, Summary]:
    """The real waits and the two simulations' (see the module docstring)."""
    lines = [r for r in read_lines(log_path) if r["application_name"] == APP]
    served = [r["xact_us"] for r in lines if r["xact_us"] is not None]
    mean_service = sum(served) / len(served) / 1e6
    config = SimConfig(pool_size=pool_size, min_pool_size=pool_size)
    replayed = simulate(replay(lines), config)
    # The arrival rate the pooler saw (the load generator's own lags a little behind).
    span = (max(r["arrival_us"] for r in lines) - min(r["arrival_us"] for r in lines)) / 1e6
    measured_rate = (len(lines) - 1) / span if span > 0 else rate
    rng = random.Random(seed)
    fresh = synthetic(len(lines) * 10, measured_rate,
                      service_sampler("exponential", mean_service, rng), rng)
    modelled = simulate(fresh, SimConfig(pool_size=pool_size, min_pool_size=pool_size))
    return {
        "real": summarise(r["wait_us"] for r in lines),
        "replay": summarise(r["wait_us"] for r in replayed),
        "synthetic": summarise(r["wait_us"] for r in modelled),
        "service": summarise(served),
    }


def margins(result: dict[str, Summary]) -> dict[str, float]:
    """Relative difference of each simulation's mean wait from the real one."""
    real = result["real"].mean
    return {name: (result[name].mean - real) / real for name in ("replay", "synthetic")}


def print_result(result: dict[str, Summary]) -> None:
    print(table([(f"wait {name}", result[name]) for name in ("real", "replay", "synthetic")]
                + [("service (real)", result["service"])]))
    for name, diff in margins(result).items():
        print(f"mean wait, {name} vs real: {diff:+.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--mean-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=40)
    args = parser.parse_args()

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
            f"transaction_log = {log_path}\nlog_connections = 0\nlog_disconnections = 0\n")
        proc = subprocess.Popen([sys.executable, "-m", "pypool", str(work / "pypool.ini")],
                                cwd=HERE.parent, stdout=subprocess.DEVNULL)
        try:
            time.sleep(1.5)
            dsn = f"postgresql://app:app-secret@127.0.0.1:{port}/app"
            late = asyncio.run(offered_load(dsn, args.rate, args.mean_ms, args.seconds,
                                            args.connections))
            time.sleep(0.5)
        finally:
            proc.terminate()
            proc.wait(10)
        print(f"pool_size {args.pool_size}, Poisson {args.rate:g}/s, exponential "
              f"{args.mean_ms:g} ms, {args.seconds:g} s; {late} arrivals started late")
        print_result(compare(log_path, args.pool_size, args.rate))
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
