"""Where the pooler's CPU goes: `perf record` on a pypool tree under pgbench -S.

    python3 bench/perf_profile.py TREE [--mode simple|prepared|extended] [--seconds N]

Starts a throwaway PostgreSQL and TREE's pooler as bench/cpu_per_tx.py does (pool 20,
transaction mode, pipelining off), runs `pgbench -S -c 50 -j 2` against it, records the
pooler with `perf record -F 999 -g` for N seconds in the middle of the run, and prints the
share of samples per library (`perf report --sort dso`) and the pooler's top symbols in its
own compiled code. Needs `perf` (linux-perf) and a TREE compiled in place for the compiled
figures (the pooler's log line says which). bench/README.md, "Where the CPU goes now".

`--user-map` records call stacks instead (`--call-graph dwarf`, at 499 Hz) and prints where
the pooler's user time goes in a real run: each pypool function's share of the user-space
samples, inclusive (itself and everything below it, libpython and uvloop included) and as
the innermost pypool function on the stack (bench/README.md, "Where a real run's user time
goes").

`--rate N` runs pgbench at a fixed rate (`-R N`) instead of as fast as it goes: the pooler
then sleeps between transactions and each one finds its code and objects pushed out of the
caches, as they are on a loaded machine (bench/README.md, "At a fixed rate").
"""

from __future__ import annotations

import argparse
import collections
import re
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
    parser.add_argument("--user-map", action="store_true",
                        help="call stacks: the user time per pypool function")
    parser.add_argument("--rate", type=int, default=0,
                        help="pgbench -R: a fixed rate of transactions a second (0: as fast "
                             "as it goes)")
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
                 "-p", str(port), "-U", "app", "-T", str(args.seconds + 6),
                 *(["-R", str(args.rate)] if args.rate else []), "bench"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            time.sleep(3)
            sampling = (["-F", "499", "--call-graph", "dwarf,16384"] if args.user_map
                        else ["-F", "999", "-g"])
            subprocess.run(["perf", "record", *sampling, "-o", str(data), "-p",
                            str(pooler.pid), "--", "sleep", str(args.seconds)],
                           check=True, capture_output=True)
            out = load.communicate()[0].decode()
            print("\n".join(line for line in out.splitlines() if "tps" in line))
        finally:
            pooler.terminate()
            pooler.wait()
        print((work / "pooler.log").read_text().splitlines()[0])
        if args.user_map:
            user_map(data)
            return
        report = ["perf", "report", "-i", str(data), "--no-children", "--stdio", "-g", "none"]
        subprocess.run([*report, "--sort", "dso"], check=True)
        subprocess.run([*report, "--sort", "symbol", "--percent-limit", "0.1"], check=True)
    finally:
        pg.stop()


def user_map(data: Path, rows: int = 30) -> None:
    """From call stacks: the share of the user-space samples under each pypool function
    (inclusive) and with it as the innermost pypool frame."""
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym,dso"],
                            check=True, capture_output=True, text=True).stdout
    stacks: list[list[tuple[str, str]]] = [[]]
    for line in script.splitlines():
        found = re.match(r"\s*\S+ (.*) \((.*)\)$", line)
        if found:
            stacks[-1].append((found.group(1), found.group(2)))
        elif stacks[-1]:
            stacks.append([])
    stacks = [stack for stack in stacks if stack]
    user = [stack for stack in stacks if "kernel" not in stack[0][1]]
    inclusive: collections.Counter[str] = collections.Counter()
    innermost: collections.Counter[str] = collections.Counter()
    for stack in user:
        names = [sym.replace("CPyPy_", "CPyDef_").removeprefix("CPyDef_")
                 for sym, _ in stack if sym.startswith(("CPyDef_", "CPyPy_"))]
        innermost[names[0] if names else f"(no pypool frame) {stack[0][0]}"] += 1
        inclusive.update(set(names))
    print(f"{len(stacks)} samples, {len(user)} in user space ({len(user) / len(stacks):.0%})")
    for title, counts in (("inclusive", inclusive), ("innermost pypool frame", innermost)):
        print(f"\nshare of user samples, {title}:")
        for name, count in counts.most_common(rows):
            print(f"  {count / len(user):6.1%}  {name}")


if __name__ == "__main__":
    main()
