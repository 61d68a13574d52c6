"""An incident: a storm of slow queries saturates the pool, with and without
query_wait_timeout.

    python3 bench/experiments/slow_query_storm/run.py [--pool-size 5] [--seconds 24]

A throwaway PostgreSQL and a pypool from this tree (transaction mode, pool_size
--pool-size, `transaction_log` on). The application's steady traffic is Poisson at --rate per
second, each transaction a 5 ms `pg_sleep`. At --storm-at seconds, --storm clients each send a
--slow-s second query at once: the pool is theirs until they finish. Run twice: with
query_wait_timeout at PgBouncer's default (120 s: nobody is turned away) and at
--timeout seconds. What the pooler saw comes from the transaction log (the queue on each
arrival, each wait, each outcome); what the clients saw is timed on their side (the
response time, or the error and when).

Writes data.json, result.md and (with matplotlib) chart.png beside this file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
sys.path.insert(0, str(ROOT))

from pypool.embedded import EmbeddedPostgres, free_port, wait_listening  # noqa: E402
from pypool.observe.distribution import summarise  # noqa: E402
from pypool.observe.txlog_file import read_lines  # noqa: E402

FAST_S = 0.005


async def traffic(dsn: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The steady traffic and the storm; one record per request as the client saw it."""
    import psycopg

    loop = asyncio.get_running_loop()
    start = loop.time() + 0.5
    seen: list[dict[str, Any]] = []

    async def connect(name: str) -> Any:
        return await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, prepare_threshold=None, application_name=name)

    spare: list[Any] = [await connect("app") for _ in range(args.connections)]

    async def request(at: float, name: str, seconds: float) -> None:
        await asyncio.sleep(max(0.0, at - loop.time()))
        conn = spare.pop() if name == "app" and spare else await connect(name)
        sent = loop.time()
        record: dict[str, Any] = {"at": sent - start, "who": name}
        try:
            await conn.execute(f"SELECT pg_sleep({seconds})")
            record["ms"] = (loop.time() - sent) * 1e3
            record["error"] = None
        except psycopg.Error as exc:
            record["ms"] = (loop.time() - sent) * 1e3
            record["error"] = exc.sqlstate or str(exc).split("\n")[0]
        seen.append(record)
        if conn.closed or name != "app":
            await conn.close()
            if name == "app":
                spare.append(await connect("app"))
        else:
            spare.append(conn)

    rng = random.Random(1)
    tasks = []
    at = start
    while at < start + args.seconds:
        at += rng.expovariate(args.rate)
        tasks.append(asyncio.create_task(request(at, "app", FAST_S)))
    for _ in range(args.storm):
        tasks.append(asyncio.create_task(request(start + args.storm_at, "storm", args.slow_s)))
    await asyncio.gather(*tasks)
    for conn in spare:
        await conn.close()
    return seen


def run_once(pg: EmbeddedPostgres, work: Path, timeout: float, args: argparse.Namespace
             ) -> dict[str, Any]:
    port = free_port()
    log_path = work / f"tx-{timeout:g}.jsonl"
    ini = work / "pypool.ini"
    ini.write_text(
        f"[databases]\napp = host={pg.host} port={pg.port} dbname=app\n\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = scram-sha-256\nauth_file = {work}/users.txt\npool_mode = transaction\n"
        f"default_pool_size = {args.pool_size}\nmin_pool_size = {args.pool_size}\n"
        f"max_client_conn = 2000\nquery_wait_timeout = {timeout:g}\n"
        f"transaction_log = {log_path}\nlog_connections = 0\nlog_disconnections = 0\n"
        "log_pooler_errors = 0\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "pypool", str(ini)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        time.sleep(0.5)
        seen = asyncio.run(traffic(f"postgresql://app:app-secret@127.0.0.1:{port}/app", args))
    finally:
        proc.terminate()
        proc.wait(30)
    lines = read_lines(log_path)
    origin = min(r["arrival_us"] for r in lines if r["application_name"] == "app")
    logged = [{"t": round((r["arrival_us"] - origin) / 1e6, 4), "who": r["application_name"],
               "queue": r["queue_on_arrival"], "wait_ms": round(r["wait_us"] / 1e3, 2),
               "outcome": r["outcome"]} for r in lines]
    for record in seen:
        record["at"], record["ms"] = round(record["at"], 4), round(record["ms"], 2)
    fast = [r for r in seen if r["who"] == "app"]
    return {
        "query_wait_timeout": timeout,
        "pooler": logged,
        "clients": seen,
        "summary": {
            "requests": len(fast),
            "errors": sum(1 for r in fast if r["error"]),
            "max_queue": max(r["queue"] for r in logged),
            "response_ms": summarise(r["ms"] for r in fast if not r["error"]).__dict__,
            "wait_ms": summarise(r["wait_ms"] for r in logged if r["who"] == "app").__dict__,
        },
    }


def chart(runs: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(2, len(runs), figsize=(12, 6.5), sharex=True, squeeze=False)
    for column, run in enumerate(runs):
        top, bottom = axes[0][column], axes[1][column]
        app = [r for r in run["pooler"] if r["who"] == "app"]
        top.plot([r["t"] for r in app], [r["queue"] for r in app], ".", markersize=3,
                 color="C0")
        top.set_ylabel("clients queued on arrival")
        top.set_title(f"query_wait_timeout = {run['query_wait_timeout']:g} s")
        top.axvline(args.storm_at, color="grey", linestyle=":")
        ok = [r for r in run["clients"] if r["who"] == "app" and not r["error"]]
        failed = [r for r in run["clients"] if r["who"] == "app" and r["error"]]
        bottom.plot([r["at"] for r in ok], [r["ms"] for r in ok], ".", markersize=3,
                    color="C2", label="answered (response time)")
        if failed:
            bottom.plot([r["at"] for r in failed], [r["ms"] for r in failed], "x",
                        markersize=4, color="C3", label="query_wait_timeout (time to error)")
        bottom.set_yscale("log")
        bottom.set_ylabel("what the client saw (ms)")
        bottom.set_xlabel("seconds")
        bottom.axvline(args.storm_at, color="grey", linestyle=":")
        bottom.legend(loc="upper right", fontsize=8)
    fig.suptitle(f"pool_size {args.pool_size}: {args.rate:g}/s of 5 ms queries; at "
                 f"{args.storm_at:g} s, {args.storm} queries of {args.slow_s:g} s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool-size", type=int, default=5)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=24.0)
    parser.add_argument("--storm-at", type=float, default=4.0)
    parser.add_argument("--storm", type=int, default=10)
    parser.add_argument("--slow-s", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=40)
    parser.add_argument("--out", default=str(HERE))
    parser.add_argument("--from-data", action="store_true",
                        help="redraw the chart and result from data.json, without running")
    args = parser.parse_args()
    out = Path(args.out)
    if args.from_data:
        data = json.loads((out / "data.json").read_text())
        publish(data["runs"], argparse.Namespace(**{**data["args"], "out": args.out}), out)
        return
    work = Path(tempfile.mkdtemp(prefix="pypool-storm-"))
    (work / "users.txt").write_text('"app" "app-secret"\n')
    pg = EmbeddedPostgres()
    pg.start()
    runs = []
    try:
        pg.create_role("app", "app-secret")
        pg.execute("CREATE DATABASE app OWNER app")
        for timeout in (120.0, args.timeout):
            runs.append(run_once(pg, work, timeout, args))
            print(f"query_wait_timeout {timeout:g}: {runs[-1]['summary']}", flush=True)
    finally:
        pg.stop()
    (out / "data.json").write_text(json.dumps(
        {"args": {k: v for k, v in vars(args).items() if k not in ("out", "from_data")},
         "runs": runs}, separators=(",", ":")) + "\n")
    publish(runs, args, out)


def publish(runs: list[dict[str, Any]], args: argparse.Namespace, out: Path) -> None:
    drawn = chart(runs, args, out / "chart.png")
    rows = ["| query_wait_timeout | requests | errors | most queued | wait mean / p99 / max "
            "(ms) | answered: response mean / p99 / max (ms) |", "|---|---|---|---|---|---|"]
    for run in runs:
        s = run["summary"]
        w, r = s["wait_ms"], s["response_ms"]
        rows.append(f"| {run['query_wait_timeout']:g} s | {s['requests']} | {s['errors']} | "
                    f"{s['max_queue']} | {w['mean']:.0f} / {w['p99']:.0f} / {w['max']:.0f} | "
                    f"{r['mean']:.0f} / {r['p99']:.0f} / {r['max']:.0f} |")
    (out / "result.md").write_text(RESULT.format(
        pool=args.pool_size, rate=args.rate, at=args.storm_at, storm=args.storm,
        slow=args.slow_s, timeout=args.timeout, table="\n".join(rows),
        chart="![queue and what clients saw, over time](chart.png)\n" if drawn else
        "(no chart: matplotlib is not installed)\n"))
    print((out / "result.md").read_text())


RESULT = """# An incident: a storm of slow queries, with and without query_wait_timeout

`python3 bench/experiments/slow_query_storm/run.py` (`--from-data` redraws this from
data.json): pool_size {pool}, steady traffic of
{rate:g} 5 ms queries a second; at {at:g} s, {storm} clients send a {slow:g} s query each at
once. Twice: query_wait_timeout at PgBouncer's default (120 s) and at {timeout:g} s. The
queue and the waits are the transaction log's (`queue_on_arrival`, `wait_us`, `outcome`);
what the clients saw is timed on their side.

{chart}
{table}

With the default, the storm takes every server and the steady traffic queues behind it: the
queue on arrival climbs for as long as the storm holds the pool, and every request is
answered, seconds late. With query_wait_timeout at {timeout:g} s the pool is just as taken,
but no request waits much longer than that (the janitor looks twice a second): those that
would have are refused (`query_wait_timeout`, the connection closed), and so were the
storm's own queries that found no server, which ends the incident sooner; the rest are
answered as before. The timeout
turns unbounded latency into bounded latency plus errors the application can see, retry or
shed. The cure is upstream (statement_timeout,
a separate pool for the slow work, or a queue policy that keeps servers for the fast
traffic: docs/research.md).
"""


if __name__ == "__main__":
    main()
