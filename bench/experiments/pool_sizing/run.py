"""Pool sizing by Little's law: TPS and latency against pool size at a fixed client count.

    python3 bench/experiments/pool_sizing/run.py [--clients 20] [--service-ms 20] [--seconds 5]

A throwaway PostgreSQL and, for each pool size, a pypool from this tree in front of it
(transaction mode, pool_size = min_pool_size = the size, `transaction_log` on). pgbench runs
--clients clients, each sending `SELECT pg_sleep(service)` back to back (a closed loop with
no think time) for --seconds. Each transaction's times come from the transaction log: TPS
(transactions / span), response time (wait + xact) mean, p50, p95, p99, and the mean
service time S.

The prediction drawn over the measurements is Little's law, L = lambda W, twice: in the pool,
the servers busy are L = min(pool, clients), so throughput X = L / S; around the whole
loop, the clients are all somewhere, N = X R, so the response time is R = N / X. Below
N servers each one adds S^-1 transactions a second and cuts the latency; past N, nothing.
Writes data.json, result.md and (with matplotlib) chart.png beside this file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
sys.path.insert(0, str(ROOT))

from pypool.embedded import EmbeddedPostgres, free_port, wait_listening  # noqa: E402
from pypool.observe.distribution import summarise  # noqa: E402
from pypool.observe.txlog_file import read_lines  # noqa: E402

SIZES = (2, 4, 6, 8, 10, 12, 16, 20, 24)


def measure(pg: EmbeddedPostgres, work: Path, size: int, args: argparse.Namespace
            ) -> dict[str, float]:
    port = free_port()
    log_path = work / f"tx-{size}.jsonl"
    ini = work / "pypool.ini"
    ini.write_text(
        f"[databases]\napp = host={pg.host} port={pg.port} dbname=app\n\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = scram-sha-256\nauth_file = {work}/users.txt\npool_mode = transaction\n"
        f"default_pool_size = {size}\nmin_pool_size = {size}\nmax_client_conn = 1000\n"
        f"transaction_log = {log_path}\nlog_connections = 0\nlog_disconnections = 0\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PGPASSWORD": "app-secret"}
    proc = subprocess.Popen([sys.executable, "-m", "pypool", str(ini)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        time.sleep(0.5)  # the pool at its size
        subprocess.run([pg.tool("pgbench"), "-n", "-f", str(work / "sleep.sql"), "-c",
                        str(args.clients), "-j", "2", "-T", str(args.seconds), "-h",
                        "127.0.0.1", "-p", str(port), "-U", "app", "app"],
                       env=env, check=True, capture_output=True)
    finally:
        proc.terminate()
        proc.wait(20)
    lines = [r for r in read_lines(log_path) if r["kind"] == "transaction"]
    span = (max(r["released_us"] for r in lines) - min(r["arrival_us"] for r in lines)) / 1e6
    response = summarise(r["wait_us"] + r["xact_us"] for r in lines)
    return {
        "pool_size": size, "transactions": len(lines), "tps": len(lines) / span,
        "response_mean_ms": response.mean / 1e3, "response_p50_ms": response.p50 / 1e3,
        "response_p95_ms": response.p95 / 1e3, "response_p99_ms": response.p99 / 1e3,
        "wait_mean_ms": summarise(r["wait_us"] for r in lines).mean / 1e3,
        "service_mean_ms": summarise(r["xact_us"] for r in lines).mean / 1e3,
    }


def predict(size: int, clients: int, service_s: float) -> tuple[float, float]:
    """Little's law: throughput and response time (ms) of the closed loop."""
    throughput = min(size, clients) / service_s
    return throughput, clients / throughput * 1e3


def chart(rows: list[dict[str, float]], clients: int, service_s: float, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sizes = [r["pool_size"] for r in rows]
    grid = list(range(1, max(sizes) + 1))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(grid, [predict(n, clients, service_s)[0] for n in grid], "-", color="grey",
              label="Little's law: min(pool, N) / S")
    left.plot(sizes, [r["tps"] for r in rows], "o", color="C0", label="measured")
    left.set_xlabel("pool_size")
    left.set_ylabel("transactions per second")
    left.legend()
    right.plot(grid, [predict(n, clients, service_s)[1] for n in grid], "-", color="grey",
               label="Little's law: N / X")
    for key, style in (("response_mean_ms", "o"), ("response_p95_ms", "^"),
                       ("response_p99_ms", "v")):
        right.plot(sizes, [r[key] for r in rows], style, label=key.split("_")[1])
    right.set_xlabel("pool_size")
    right.set_ylabel("response time (ms)")
    right.set_yscale("log")
    right.legend()
    fig.suptitle(f"{clients} clients in a closed loop, transactions of S = "
                 f"{service_s * 1000:.1f} ms (pg_sleep), through pypool")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--service-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--out", default=str(HERE))
    args = parser.parse_args()
    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="pypool-sizing-"))
    (work / "users.txt").write_text('"app" "app-secret"\n')
    (work / "sleep.sql").write_text(f"SELECT pg_sleep({args.service_ms / 1000});\n")
    pg = EmbeddedPostgres()
    pg.start()
    rows = []
    try:
        pg.create_role("app", "app-secret")
        pg.execute("CREATE DATABASE app OWNER app")
        for size in map(int, args.sizes.split(",")):
            row = measure(pg, work, size, args)
            rows.append(row)
            print(f"pool_size {size:3d}: {row['tps']:7.1f} tps, response mean "
                  f"{row['response_mean_ms']:7.2f} ms p95 {row['response_p95_ms']:7.2f} "
                  f"p99 {row['response_p99_ms']:7.2f}", flush=True)
    finally:
        pg.stop()
    service_s = sum(r["service_mean_ms"] for r in rows) / len(rows) / 1e3
    data = {"clients": args.clients, "service_ms": args.service_ms, "seconds": args.seconds,
            "measured_service_ms": service_s * 1e3, "rows": rows}
    (out / "data.json").write_text(json.dumps(data, indent=1) + "\n")
    drawn = chart(rows, args.clients, service_s, out / "chart.png")
    table = ["| pool_size | TPS | predicted | mean (ms) | predicted | p95 | p99 |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        tps, response = predict(int(r["pool_size"]), args.clients, service_s)
        table.append(f"| {r['pool_size']} | {r['tps']:.1f} | {tps:.1f} | "
                     f"{r['response_mean_ms']:.2f} | {response:.2f} | "
                     f"{r['response_p95_ms']:.2f} | {r['response_p99_ms']:.2f} |")
    (out / "result.md").write_text(RESULT.format(
        clients=args.clients, service=args.service_ms, seconds=args.seconds,
        measured=service_s * 1e3, table="\n".join(table),
        chart="![TPS and latency against pool size](chart.png)\n" if drawn else
        "(no chart: matplotlib is not installed)\n"))
    print((out / "result.md").read_text())


RESULT = """# Pool sizing by Little's law

`python3 bench/experiments/pool_sizing/run.py`: {clients} pgbench clients in a closed loop
(no think time), each transaction a `SELECT pg_sleep({service:g} ms)`, {seconds} s per pool
size, through pypool in transaction mode; every number from the transaction log. Measured
mean service time S = {measured:.2f} ms (the sleep plus a round trip).

{chart}
{table}

Little's law predicts both curves from S alone. In the pool, L = lambda W: the servers busy
are min(pool, N), so the throughput is min(pool, N) / S. Around the loop, the N clients are
all waiting or served, N = X R, so the response time is N / X. Below N = {clients} servers,
each server adds 1/S transactions a second and the queue (the response time above S) shrinks;
from N on, a bigger pool buys nothing: every client already has a server. The tails (p95,
p99) follow the mean while clients queue, and fall to the service time's own spread once
nobody waits.
"""


if __name__ == "__main__":
    main()
