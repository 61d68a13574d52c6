"""System calls per transaction, pypool against PgBouncer: `strace -c` on each pooler.

    python3 bench/syscalls_per_tx.py [--mode simple|prepared|extended] [--pgbouncer PATH]

Starts a throwaway PostgreSQL, then pypool (this tree, `pipeline_depth = 0`, one worker) and
PgBouncer (`pgbouncer` on PATH, or --pgbouncer) with the same settings (pool 20, transaction
mode, SCRAM), warms each with 3 s of `pgbench -S -c 50 -j 2`, then counts each one's system
calls with `strace -c -f` over 50,000 transactions and prints them per transaction. strace
slows both; the counts, not the times, are the figure. bench/README.md, "System calls per
transaction".
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
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


def ini(name: str, port: int, pg: EmbeddedPostgres, work: Path) -> str:
    own = "pipeline_depth = 0\n" if name == "pypool" else ""
    return (f"[databases]\nbench = host={pg.host} port={pg.port} dbname=bench\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
            f"unix_socket_dir =\nauth_type = scram-sha-256\nauth_file = {work}/userlist.txt\n"
            "pool_mode = transaction\ndefault_pool_size = 20\nmax_client_conn = 500\n"
            "log_connections = 0\nlog_disconnections = 0\n" + own)


def start(name: str, work: Path, pg: EmbeddedPostgres, pgbouncer: str, env: dict[str, str]
          ) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    path = work / f"{name}.ini"
    path.write_text(ini(name, port, pg, work))
    if name == "pypool":
        command = [sys.executable, "-m", "pypool", str(path)]
    else:
        command = [pgbouncer, str(path)]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            shutil.chown(work, "postgres")
            for file in work.iterdir():
                shutil.chown(file, "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
    with open(work / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(command, cwd=HERE.parent, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    wait_listening(port, "127.0.0.1", 20)
    return proc, port


def pooler_pid(name: str, proc: subprocess.Popen[bytes]) -> int:
    if name == "pypool":
        return proc.pid
    # Under runuser, the pooler is its child.
    found = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    return int(found.stdout.split()[0]) if found.stdout.strip() else proc.pid


def count(name: str, pid: int, port: int, mode: str, pgbench: str, env: dict[str, str],
          work: Path) -> dict[str, float]:
    """Per-transaction system calls of process `pid` over a pgbench run."""
    base = [pgbench, "-S", "-M", mode, "-c", "50", "-j", "2", "-h", "127.0.0.1", "-p",
            str(port), "-U", "app"]
    subprocess.run([*base, "-T", "3", "bench"], env=env, capture_output=True, check=True)
    out = work / f"{name}.strace"
    tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
                              stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    run = subprocess.run([*base, "-t", "1000", "bench"], env=env, capture_output=True,
                         text=True, check=True)
    tracer.terminate()
    tracer.wait()
    found = re.search(r"actually processed: (\d+)", run.stdout)
    assert found, run.stdout
    transactions = int(found.group(1))
    calls: dict[str, float] = {}
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[3].isdigit() and parts[-1] != "total":
            calls[parts[-1]] = int(parts[3]) / transactions
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="simple", choices=["prepared", "simple", "extended"])
    parser.add_argument("--pgbouncer", default="pgbouncer")
    args = parser.parse_args()
    pg = EmbeddedPostgres()
    pg.start()
    work = Path(tempfile.mkdtemp(prefix="pypool-syscalls-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env = {**bench_database(pg, work), "PYTHONPATH": str(HERE.parent)}
        pgbench = pg.tool("pgbench")
        results = {}
        for name in ("pypool", "pgbouncer"):
            proc, port = start(name, work, pg, args.pgbouncer, env)
            procs.append(proc)
            results[name] = count(name, pooler_pid(name, proc), port, args.mode, pgbench,
                                  env, work)
        names = sorted({call for calls in results.values() for call in calls
                        if calls[call] >= 0.01}, key=lambda c: -results["pgbouncer"].get(c, 0))
        print(f"pgbench -S -M {args.mode} -c 50 -j 2, system calls per transaction")
        print(f"{'call':16s} {'pypool':>8s} {'pgbouncer':>10s}")
        for call in names:
            print(f"{call:16s} {results['pypool'].get(call, 0):8.2f} "
                  f"{results['pgbouncer'].get(call, 0):10.2f}")
        print(f"{'all':16s} {sum(results['pypool'].values()):8.2f} "
              f"{sum(results['pgbouncer'].values()):10.2f}")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
        pg.stop()


if __name__ == "__main__":
    main()
