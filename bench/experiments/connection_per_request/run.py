"""The cost of a connection per request (serverless): connect, one query, disconnect, with
SCRAM, directly to PostgreSQL and through pypool (and PgBouncer, when installed).

    python3 bench/experiments/connection_per_request/run.py [--requests 400]

A throwaway PostgreSQL (SCRAM-SHA-256), a pypool from this tree in front of it (transaction
mode, SCRAM with its clients, the userlist holding the role's SCRAM verifier), and PgBouncer
the same way if `pgbouncer` is on PATH. One client, in turn to each target, --requests times:
libpq connects (TCP, startup, the SCRAM exchange), runs `SELECT 1`, disconnects. Each
request is timed whole and in two parts, connect and query. Directly, every request pays
PostgreSQL's backend fork and its SCRAM; through a pooler, the client's SCRAM is with the
pooler and the query runs on a server connection already open.

Writes data.json, result.md and (with matplotlib) chart.png beside this file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def requests(dsn: str, count: int) -> list[tuple[float, float]]:
    """(connect ms, query ms) of each request, after five to warm up."""
    import psycopg

    out = []
    for n in range(count + 5):
        started = time.perf_counter()
        conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
        connected = time.perf_counter()
        conn.execute("SELECT 1").fetchone()
        conn.close()
        done = time.perf_counter()
        if n >= 5:
            out.append(((connected - started) * 1e3, (done - connected) * 1e3))
    return out


def ini_text(kind: str, pg: EmbeddedPostgres, port: int, work: Path) -> str:
    common = (f"[databases]\napp = host={pg.host} port={pg.port} dbname=app\n\n"
              f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
              f"auth_type = scram-sha-256\nauth_file = {work}/users.txt\n"
              "pool_mode = transaction\ndefault_pool_size = 5\nmax_client_conn = 100\n"
              "log_connections = 0\nlog_disconnections = 0\n")
    if kind == "pypool":
        return common + "unix_socket_dir =\n"
    return common + f"unix_socket_dir = {work}\nlogfile = {work}/pgbouncer.log\n"


def through(kind: str, pg: EmbeddedPostgres, work: Path, count: int
            ) -> list[tuple[float, float]]:
    port = free_port()
    ini = work / f"{kind}.ini"
    ini.write_text(ini_text(kind, pg, port, work))
    command = [sys.executable, "-m", "pypool", str(ini)]
    if kind == "pgbouncer":
        command = ["pgbouncer", str(ini)]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            for path in (work, work / "users.txt", ini):
                shutil.chown(path, "postgres", "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
    env = {"PATH": "/usr/sbin:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        return requests(f"postgresql://app:app-secret@127.0.0.1:{port}/app", count)
    finally:
        proc.terminate()
        proc.wait(20)


def chart(results: dict[str, list[tuple[float, float]]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axis = plt.subplots(figsize=(8, 4.5))
    for name, runs in results.items():
        totals = sorted(c + q for c, q in runs)
        axis.plot(totals, [(i + 1) / len(totals) for i in range(len(totals))], label=name)
    axis.set_xscale("log")
    axis.set_xlabel("connect + SELECT 1 + disconnect (ms)")
    axis.set_ylabel("share of requests at most this long")
    axis.set_title("A connection per request, SCRAM-SHA-256")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--out", default=str(HERE))
    args = parser.parse_args()
    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="pypool-connect-"))
    work.chmod(0o755)
    pg = EmbeddedPostgres()
    pg.start()
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        pg.create_role("app", "app-secret")
        pg.execute("CREATE DATABASE app OWNER app")
        (work / "users.txt").write_text(f'"app" "{pg.scram_verifier("app")}"\n')
        results["PostgreSQL directly"] = requests(pg.dsn("app").replace(
            f"{pg.superuser}:{pg.password}", "app:app-secret"), args.requests)
        results["through pypool"] = through("pypool", pg, work, args.requests)
        if shutil.which("pgbouncer"):
            version = subprocess.run(["pgbouncer", "--version"], capture_output=True,
                                     text=True, check=False).stdout.split("\n")[0]
            results[f"through {version}"] = through("pgbouncer", pg, work, args.requests)
    finally:
        pg.stop()
    summary: dict[str, Any] = {}
    for name, runs in results.items():
        summary[name] = {part: summarise(values).__dict__ for part, values in (
            ("total", [c + q for c, q in runs]), ("connect", [c for c, _ in runs]),
            ("query", [q for _, q in runs]))}
    (out / "data.json").write_text(json.dumps({
        "requests": args.requests, "summary": summary,
        "runs": {name: [[round(c, 3), round(q, 3)] for c, q in runs]
                 for name, runs in results.items()}}, separators=(",", ":")) + "\n")
    drawn = chart(results, out / "chart.png")
    rows = ["| target | total mean | p50 | p95 | p99 | connect mean | query mean |",
            "|---|---|---|---|---|---|---|"]
    for name, parts in summary.items():
        t, c, q = parts["total"], parts["connect"], parts["query"]
        rows.append(f"| {name} | {t['mean']:.2f} | {t['p50']:.2f} | {t['p95']:.2f} | "
                    f"{t['p99']:.2f} | {c['mean']:.2f} | {q['mean']:.2f} |")
    (out / "result.md").write_text(RESULT.format(
        requests=args.requests, table="\n".join(rows),
        chart="![latency distribution of a connection per request](chart.png)\n" if drawn
        else "(no chart: matplotlib is not installed)\n"))
    print((out / "result.md").read_text())


RESULT = """# The cost of a connection per request

`python3 bench/experiments/connection_per_request/run.py`: {requests} requests to each
target from one client, each a new libpq connection with SCRAM-SHA-256, `SELECT 1` and a
disconnect. Times in ms, on this 2-core machine with everything on it.

{chart}
{table}

Directly, every request makes PostgreSQL fork a backend and run its side of SCRAM before the
query. Through a pooler the client still does a whole SCRAM exchange (with the pooler, which
checks it against the role's verifier), but no backend starts: the query runs on a server
connection that is already open, and the disconnect frees nothing on the PostgreSQL side.
"""


if __name__ == "__main__":
    main()
