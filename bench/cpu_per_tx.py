"""Pooler CPU per transaction, A/B between pypool source trees, with a fixed transaction count.

    python3 bench/cpu_per_tx.py [--mode prepared|simple|extended] [--rounds N] TREE TREE ...

Each TREE is a pypool source tree, optionally followed by [pgbouncer] settings that replace
the defaults below, each after a `+` (`/work/main+session_state=ignore+max_prepared_statements=0`):
so one tree measured with and without a feature gives that feature's cost on the common
path. A tree is (compiled in place with `python3 setup.py build_ext
--inplace`, or not: the pooler's log says which). One throwaway PostgreSQL serves them all;
each round starts each tree's pooler in turn (pool 20, transaction mode, pipelining off),
warms it up, runs `pgbench -S -M MODE -c 50 -j 2 -t 2000` (100,000 transactions) and reads
the pooler's user and system CPU from /proc before and after. CPU time per transaction
moves far less with the machine's noise than TPS does, which is why bench/ab.py and this
script report it; the medians over the rounds are printed last.

The session that split the pooler and moved the reply bookkeeping into core/ used it to
compare the tree it started from with its own (bench/README.md, "Pooler CPU per transaction
across a refactor").
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pypool.embedded import EmbeddedPostgres, wait_listening  # noqa: E402

CLIENTS, THREADS, PER_CLIENT = 50, 2, 2000
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def bench_database(pg: EmbeddedPostgres, work: Path) -> dict[str, str]:
    """Role `app`, database `bench` at pgbench scale 1, and work/userlist.txt for the pooler;
    the environment pgbench runs with (its password). perf_profile.py and syscalls_per_tx.py
    start the same way."""
    pg.create_role("app", "app-secret")
    pg.execute("CREATE DATABASE bench OWNER app")
    env = {**os.environ, "PGPASSWORD": "app-secret"}
    subprocess.run([pg.tool("pgbench"), "-i", "-s", "1", "-q", "-h", pg.host, "-p",
                    str(pg.port), "-U", "app", "bench"], env=env, check=True, capture_output=True)
    (work / "userlist.txt").write_text('"app" "app-secret"\n')
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="prepared", choices=["prepared", "simple", "extended"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("trees", nargs="+")
    args = parser.parse_args()
    pg = EmbeddedPostgres()
    pg.start()
    work = Path(tempfile.mkdtemp(prefix="pypool-cpu-"))
    results: dict[str, list[tuple[float, float]]] = {tree: [] for tree in args.trees}
    try:
        env = bench_database(pg, work)
        pgbench = pg.tool("pgbench")
        for _ in range(args.rounds):
            for target in args.trees:
                tree, *overrides = target.split("+")
                port = free_port()
                ini = work / "pooler.ini"
                ini.write_text(
                    f"[databases]\nbench = host={pg.host} port={pg.port} dbname=bench\n"
                    f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
                    f"auth_type = scram-sha-256\nauth_file = {work}/userlist.txt\n"
                    "pool_mode = transaction\ndefault_pool_size = 20\nmax_client_conn = 500\n"
                    "pipeline_depth = 0\nlog_connections = 0\nlog_disconnections = 0\n"
                    + "".join(f"{item}\n" for item in overrides)
                )
                with open(work / "pooler.log", "ab") as log:
                    proc = subprocess.Popen([sys.executable, "-m", "pypool", str(ini)], cwd=tree,
                                            env={**env, "PYTHONPATH": tree}, stdout=log,
                                            stderr=subprocess.STDOUT)
                try:
                    wait_listening(port)
                    command = [pgbench, "-S", "-M", args.mode, "-c", str(CLIENTS), "-j",
                               str(THREADS), "-h", "127.0.0.1", "-p", str(port), "-U", "app",
                               "bench"]
                    subprocess.run([*command, "-t", "200"], env=env, capture_output=True)
                    user0, sys0 = cpu_seconds(proc.pid)
                    subprocess.run([*command, "-t", str(PER_CLIENT)], env=env,
                                   capture_output=True, check=True)
                    user1, sys1 = cpu_seconds(proc.pid)
                finally:
                    proc.terminate()
                    proc.wait()
                count = CLIENTS * PER_CLIENT
                total = (user1 - user0 + sys1 - sys0) / count * 1e6
                user = (user1 - user0) / count * 1e6
                results[target].append((total, user))
                print(f"{target:32s} {total:6.2f} us per transaction (user {user:5.2f})",
                      flush=True)
    finally:
        pg.stop()
    print(f"pgbench -S -M {args.mode}, {CLIENTS} clients, {CLIENTS * PER_CLIENT} transactions;"
          " medians:")
    first = statistics.median(t for t, _ in results[args.trees[0]])
    for tree, runs in results.items():
        total = statistics.median(t for t, _ in runs)
        user = statistics.median(u for _, u in runs)
        print(f"{tree:32s} {total:6.2f} us (user {user:5.2f}), {total / first:.2f}x the first")


if __name__ == "__main__":
    main()
