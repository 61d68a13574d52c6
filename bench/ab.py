"""A/B runs for the pooler's hot path: pypool variants against PgBouncer on one cluster.

    python3 bench/ab.py [--duration S] [--rounds N] VARIANT ... [-- PGBENCH ARGS]

A VARIANT is a pypool source tree, optionally with `@key=value,...`: lowercase keys are ini
settings (`@pipeline_depth=0`, `@workers=2`), uppercase ones environment variables for the
pooler process; or `floor`, bench/pool_floor.py (the least a pooler on uvloop does),
optionally with `@KEY=value,...` environment variables (`floor@POOL_FLOOR_TOUCH=30`). `.`
is this checkout. `@PYTHON=/usr/bin/python3` runs that variant's pooler on another
interpreter (its tree compiled in place by that interpreter: `python setup.py build_ext
--inplace`), for what the interpreter's own build costs (bench/README.md). PGBENCH ARGS
default to `-S -M prepared -c 100 -j 100` (pool 20, as in bench/run's
select-prepared-c100). PgBouncer (bench/run's build, same ini) and each variant run in
turn, `--rounds` times, a fresh pooler process per run.

Per transaction, each run prints what bench/run does not: the pooler's user and system
CPU, PostgreSQL's CPU, pgbench's own CPU and how often it slept and was woken (its voluntary
context switches), the machine's idle time, and from
/proc/PID/schedstat how long the pooler waited on a run queue and how often it was
scheduled. On a 2-core box a single-threaded pooler is the bottleneck when its CPU time
plus its run-queue wait per transaction approaches 1 / TPS: both PgBouncer and pypool get
there under this load (bench/README.md, "What limits pypool now").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pg_cluster
import pgbouncer_build
import poolers
import procstats

HERE = Path(__file__).resolve().parent
DEFAULT_PGBENCH = ["-S", "-M", "prepared", "-c", "100", "-j", "100"]


def idle_seconds() -> float:
    fields = open("/proc/stat").readline().split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


def cpu_split(root: int) -> tuple[float, float]:
    """User and system CPU seconds of a process and its children (workers)."""
    user = system = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in procstats.tree_pids(root):
        try:
            fields = procstats.stat_fields(pid)
        except FileNotFoundError:
            continue
        user += int(fields[11]) / tick
        system += int(fields[12]) / tick
    return user, system


def run_queue(root: int) -> tuple[float, int]:
    """Seconds spent runnable but waiting for a CPU, and the number of times scheduled."""
    waited, slices = 0.0, 0
    for pid in procstats.tree_pids(root):
        try:
            _, wait, count = map(int, open(f"/proc/{pid}/schedstat").read().split())
        except FileNotFoundError:
            continue
        waited += wait / 1e9
        slices += count
    return waited, slices


def variant(spec: str, index: int, base: poolers.Target, workdir: Path) -> poolers.Target:
    tree, _, options = spec.partition("@")
    tree = str(Path(tree).resolve())
    pairs = dict(item.split("=", 1) for item in options.split(",") if item)
    ini = {key: value for key, value in pairs.items() if key.islower()}
    env = {key: value for key, value in pairs.items() if not key.islower()}
    python = env.pop("PYTHON", sys.executable)
    path = workdir / f"variant{index}.ini"
    return poolers.Target(
        f"pypool{index}{'@' + options if options else ''}", "pypool", 0, ini=path,
        settings=dict(base.settings, **ini),
        command=[python, "-m", "pypool", str(path)],
        popen_kwargs=dict(cwd=tree, env=dict(os.environ, PYTHONPATH=tree, **env)),
        logfile=workdir / f"variant{index}.log",
    )


def floor_variant(spec: str, floor: poolers.Target) -> poolers.Target:
    """`floor`, or `floor@KEY=value,...`: the pooling floor with those environment
    variables (bench/pool_floor.py's POOL_FLOOR_TOUCH, POOL_FLOOR_SHARED)."""
    _, _, options = spec.partition("@")
    if not options:
        return floor
    env = dict(item.split("=", 1) for item in options.split(","))
    return dataclasses.replace(
        floor, name=spec,
        popen_kwargs=dict(floor.popen_kwargs, env=dict(os.environ, **env)))


def throwaway_cluster(prefix: str) -> tuple[Path, pg_cluster.Cluster]:
    """A scratch directory and a PostgreSQL cluster in it (not yet created), as this script
    and bench/steady.py use them."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    workdir.chmod(0o755)  # the postgres user works in here too
    cluster = pg_cluster.Cluster(
        bindir=pg_cluster.newest_bindir(), workdir=workdir, port=poolers.free_port(),
        user="bench", password="bench-password", dbname="bench",
    )
    return workdir, cluster


def main() -> None:
    argv = sys.argv[1:]
    pgbench_args = DEFAULT_PGBENCH
    if "--" in argv:
        cut = argv.index("--")
        argv, pgbench_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=8, help="seconds per pgbench run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("variants", nargs="+", help="pypool tree[@key=value,...]")
    args = parser.parse_args(argv)

    workdir, cluster = throwaway_cluster("pypool-ab-")
    binary, version, _ = pgbouncer_build.resolve(HERE / ".cache")
    targets: list[poolers.Target] = []
    try:
        cluster.create()
        cluster.load_pgbench(10)
        floors = any(spec.partition("@")[0] == "floor" for spec in args.variants)
        pgbouncer, base, *floor = poolers.make_targets(
            ["pgbouncer", "pypool", *(["floor"] if floors else [])],
            [], [0], cluster, workdir, binary,
            bool(version and version >= pgbouncer_build.MIN_VERSION),
        )
        targets = [pgbouncer] + [
            floor_variant(spec, floor[0]) if spec.partition("@")[0] == "floor"
            else variant(spec, n, base, workdir)
            for n, spec in enumerate(args.variants)
        ]
        tps: dict[str, list[float]] = {target.name: [] for target in targets}
        print(f"pgbench {' '.join(pgbench_args)}, {args.duration} s per run; per transaction:")
        for _ in range(args.rounds):
            for target in targets:
                target.start(cluster)
                assert target.pid is not None
                user0, sys0 = cpu_split(target.pid)
                wait0, slices0 = run_queue(target.pid)
                pg0, idle0 = cluster.cpu_seconds(), idle_seconds()
                children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                out = subprocess.run(
                    [str(cluster.bindir / "pgbench"), "-n", "-T", str(args.duration),
                     *pgbench_args, *cluster.client_args(target.port)],
                    env=cluster.client_env(), capture_output=True, text=True,
                )
                user1, sys1 = cpu_split(target.pid)
                wait1, slices1 = run_queue(target.pid)
                pg1, idle1 = cluster.cpu_seconds(), idle_seconds()
                children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                target.stop()
                found = re.search(r"tps = ([\d.]+)", out.stdout)
                if not found:
                    print(f"{target.name}: pgbench failed\n{out.stdout[-400:]}{out.stderr[-400:]}")
                    continue
                rate = float(found.group(1))
                tps[target.name].append(rate)
                per = 1e6 / (rate * args.duration)  # microseconds per transaction per second
                clients = (children1.ru_utime - children0.ru_utime
                           + children1.ru_stime - children0.ru_stime)
                # pgbench's sleeps that ended in a wake-up (voluntary context switches), per
                # transaction: how often it is woken for fewer replies each.
                waits = (children1.ru_nvcsw - children0.ru_nvcsw) / (rate * args.duration)
                print(f"{target.name:28s} {rate:8.0f} tps  pooler user {(user1 - user0) * per:5.1f}"
                      f" sys {(sys1 - sys0) * per:5.1f}  runq {(wait1 - wait0) * per:5.1f}"
                      f" ({(slices1 - slices0) * per / 1e6:.2f} slices)"
                      f"  postgres {(pg1 - pg0) * per:5.1f}  pgbench {clients * per:5.1f}"
                      f" ({waits:.2f} waits)"
                      f"  idle {(idle1 - idle0) * per:5.1f} us", flush=True)
        reference = sorted(tps[pgbouncer.name])
        for name, rates in tps.items():
            if rates and reference:
                median = sorted(rates)[len(rates) // 2]
                ratio = median / reference[len(reference) // 2]
                print(f"{name:28s} median {median:8.0f} tps, {ratio:.3f}x PgBouncer")
    finally:
        for target in targets:
            target.stop()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
