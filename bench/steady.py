"""One pooler, one long pgbench run: its TPS and its CPU interval by interval.

    python3 bench/steady.py [--seconds S] [--every N] POOLER [-- PGBENCH ARGS]

POOLER is `pypool` (this checkout, as bench/ab.py runs it), `pgbouncer` (bench/run's build)
or `floor` (bench/pool_floor.py). A throwaway cluster (pgbench scale 10), the same ini as
bench/ab.py's, then `pgbench -n -P N -T S` (default `-S -c 100 -j 4`) against the pooler
alone; the pooler's user and system CPU is read from /proc every N seconds. It prints
pgbench's progress TPS for each interval and the pooler's CPU per transaction in it.

bench/run's 10-second runs start a fresh pooler each time, so each carries the logins and
the first seconds of a cold process; this shows whether a pooler's rate holds, drifts or
ramps over a run, and what it settles at (bench/README.md, "Where the rest of the gap is").
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pgbouncer_build  # noqa: E402
import poolers  # noqa: E402
from ab import cpu_split, throwaway_cluster  # noqa: E402


def main() -> None:
    argv = sys.argv[1:]
    pgbench_args = ["-S", "-c", "100", "-j", "4"]
    if "--" in argv:
        cut = argv.index("--")
        argv, pgbench_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--every", type=int, default=5, help="seconds per interval")
    parser.add_argument("pooler", choices=["pypool", "pgbouncer", "floor"])
    args = parser.parse_args(argv)

    workdir, cluster = throwaway_cluster("pypool-steady-")
    binary, version, _ = pgbouncer_build.resolve(HERE / ".cache")
    target = None
    try:
        cluster.create()
        cluster.load_pgbench(10)
        pgbouncer, pypool, floor = poolers.make_targets(
            ["pgbouncer", "pypool", "floor"], [], [0], cluster, workdir, binary,
            bool(version and version >= pgbouncer_build.MIN_VERSION),
        )
        target = {"pgbouncer": pgbouncer, "pypool": pypool, "floor": floor}[args.pooler]
        target.start(cluster)
        assert target.pid is not None
        pid = target.pid
        run = subprocess.Popen(
            [str(cluster.bindir / "pgbench"), "-n", "-T", str(args.seconds),
             "-P", str(args.every), *pgbench_args, *cluster.client_args(target.port)],
            env=cluster.client_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        samples: list[tuple[float, float, float]] = []

        def sample() -> None:
            while run.poll() is None:
                samples.append((time.monotonic(), *cpu_split(pid)))
                time.sleep(args.every)

        threading.Thread(target=sample, daemon=True).start()
        out = run.communicate()[0]
        rates = [float(rate) for rate in re.findall(r"progress: [\d.]+ s, ([\d.]+) tps", out)]
        print(f"{args.pooler}, pgbench {' '.join(pgbench_args)}, {args.seconds} s, "
              f"every {args.every} s:")
        for n, rate in enumerate(rates):
            line = f"  {(n + 1) * args.every:4d} s  {rate:8.0f} tps"
            if n + 1 < len(samples) and rate:
                (t0, user0, sys0), (t1, user1, sys1) = samples[n], samples[n + 1]
                per = 1e6 / (rate * (t1 - t0))
                line += (f"  pooler user {(user1 - user0) * per:5.1f}"
                         f" sys {(sys1 - sys0) * per:5.1f} us/tx")
            print(line)
        if rates:
            settled = sorted(rates[1:] or rates)
            print(f"  median after the first interval: {settled[len(settled) // 2]:.0f} tps")
    finally:
        if target is not None:
            target.stop()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
