"""Where the pooler's CPU goes: `perf record` on a pypool tree under pgbench -S.

    python3 bench/perf_profile.py TREE [--mode simple|prepared|extended] [--seconds N]

Starts a throwaway PostgreSQL and TREE's pooler as bench/cpu_per_tx.py does (pool 20,
transaction mode, pipelining off), runs `pgbench -S -c 50 -j 2` against it, records the
pooler with `perf record -F 999 -g` for N seconds in the middle of the run, and prints the
share of samples per library (`perf report --sort dso`) and the pooler's top symbols in its
own compiled code. Needs `perf` (linux-perf) and a TREE compiled in place for the compiled
figures (the pooler's log line says which). bench/README.md, "Where the CPU goes now".
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from cpu_per_tx import bench_database, free_port  # noqa: E402

from pypool.embedded import EmbeddedPostgres, wait_listening  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree")
    parser.add_argument("--mode", default="simple", choices=["prepared", "simple", "extended"])
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    pg = EmbeddedPostgres()
    pg.start()
    work = Path(tempfile.mkdtemp(prefix="pypool-perf-"))
    data = work / "perf.data"
    try:
        env = bench_database(pg, work)
        pgbench = pg.tool("pgbench")
        port = free_port()
        ini = work / "pooler.ini"
        ini.write_text(
            f"[databases]\nbench = host={pg.host} port={pg.port} dbname=bench\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
            f"auth_type = scram-sha-256\nauth_file = {work}/userlist.txt\n"
            "pool_mode = transaction\ndefault_pool_size = 20\nmax_client_conn = 500\n"
            "pipeline_depth = 0\nlog_connections = 0\nlog_disconnections = 0\n")
        with open(work / "pooler.log", "ab") as log:
            pooler = subprocess.Popen([sys.executable, "-m", "pypool", str(ini)], cwd=args.tree,
                                      env={**env, "PYTHONPATH": args.tree}, stdout=log,
                                      stderr=subprocess.STDOUT)
        try:
            wait_listening(port)
            load = subprocess.Popen(
                [pgbench, "-S", "-M", args.mode, "-c", "50", "-j", "2", "-h", "127.0.0.1",
                 "-p", str(port), "-U", "app", "-T", str(args.seconds + 6), "bench"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            time.sleep(3)
            subprocess.run(["perf", "record", "-F", "999", "-g", "-o", str(data), "-p",
                            str(pooler.pid), "--", "sleep", str(args.seconds)],
                           check=True, capture_output=True)
            out = load.communicate()[0].decode()
            print("\n".join(line for line in out.splitlines() if "tps" in line))
        finally:
            pooler.terminate()
            pooler.wait()
        print((work / "pooler.log").read_text().splitlines()[0])
        report = ["perf", "report", "-i", str(data), "--no-children", "--stdio", "-g", "none"]
        subprocess.run([*report, "--sort", "dso"], check=True)
        subprocess.run([*report, "--sort", "symbol", "--percent-limit", "0.1"], check=True)
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
