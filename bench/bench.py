"""pypool benchmark harness: pypool against PgBouncer, with direct PostgreSQL as reference.

Run it through ``bench/run`` (which installs matplotlib if missing and raises the
open-files limit). It makes a throwaway PostgreSQL cluster, loads ``pgbench -i -s 10``,
writes one pgbouncer.ini that both poolers start from, runs every scenario against the
targets in alternation (pypool, PgBouncer, direct, pypool, PgBouncer, direct, ...) with a
fresh pooler process per run, and writes bench/results/latest.{md,json,png}.
See bench/README.md for what each scenario measures and how to read the ratios.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pg_cluster
import pgbouncer_build
import poolers
import report
import scenarios

BENCH = Path(__file__).resolve().parent
CACHE = BENCH / ".cache"
RESULTS = BENCH / "results"
PGBENCH_SCALE = 10
TARGET_NAMES = ("pypool", "pgbouncer", "relay", "direct", "floor")
DEFAULT_TARGETS = TARGET_NAMES[:-1]  # the floor runs only when named
IDLE_FD_HEADROOM = 100  # listening socket, server connections, log files


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args() -> argparse.Namespace:
    listing = "\n".join(f"  {s.name:22} {s.description}" for s in scenarios.SCENARIOS)
    parser = argparse.ArgumentParser(
        description="Benchmark pypool against PgBouncer and direct PostgreSQL.",
        epilog=f"scenarios:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 2 s per scenario, 1 repetition"
    )
    parser.add_argument(
        "--duration", type=int, help="seconds per pgbench run (default 20, --quick 2)"
    )
    parser.add_argument("--reps", type=int, help="runs of each target (default 3, --quick 1)")
    parser.add_argument("--only", type=_csv, help="comma-separated scenario names")
    parser.add_argument(
        "--poolers",
        type=_csv,
        default=list(DEFAULT_TARGETS),
        help="comma-separated targets, run in this order (default pypool,pgbouncer,relay,direct; "
             "relay: the no-op uvloop relay, bench/relay.py, the floor for pooler CPU; "
             "floor: the least a pooler on uvloop does, bench/pool_floor.py, the floor for TPS)",
    )
    parser.add_argument(
        "--workers",
        type=lambda text: [int(item) for item in _csv(text)],
        default=[],
        help="comma-separated pypool worker counts; each runs as pypool-wN (ini: workers = N)",
    )
    parser.add_argument(
        "--pipeline-depth",
        type=lambda text: [int(item) for item in _csv(text)],
        default=[0],
        help="comma-separated pypool pipeline_depth values (default 0, pypool's default); "
        "each pypool label ends in -pdN",
    )
    args = parser.parse_args()
    args.duration = args.duration or (2 if args.quick else 20)
    args.reps = args.reps or (1 if args.quick else 3)
    unknown = [name for name in args.poolers if name not in TARGET_NAMES]
    if unknown:
        parser.error(f"unknown --poolers {unknown}; choose from {', '.join(TARGET_NAMES)}")
    if args.only:
        unknown = [name for name in args.only if name not in scenarios.BY_NAME]
        if unknown:
            parser.error(f"unknown scenario(s) {unknown}; see --help for the list")
    return args


def machine() -> str:
    meminfo = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"{os.cpu_count()} CPUs ({model}), {int(meminfo[1]) / 1024**2:.1f} GiB RAM, "
        f"Linux {platform.release()}; load average before the run {load}"
    )


def pypool_version() -> str:
    repo = poolers.REPO
    version = (
        subprocess.run(
            [sys.executable, "-c",
             "import pypool; print(pypool.__version__); print(pypool.compiled.status)"],
            capture_output=True,
            text=True,
            cwd=repo,
            env=dict(os.environ, PYTHONPATH=str(repo)),
        ).stdout.strip()
        or "unknown"
    )
    git = ["git", "-C", str(repo)]
    revision = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "pypool"], capture_output=True, text=True
    ).stdout.strip()
    version, _, hot_path = version.partition("\n")  # and "compiled with mypyc (...)"
    details = f"git {revision}{'+uncommitted' if dirty else ''}"
    return f"{version} ({details}; hot path {hot_path})" if hot_path else f"{version} ({details})"


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def check_fd_limit(selected: list[scenarios.Scenario]) -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max((s.idle_clients for s in selected), default=0) + IDLE_FD_HEADROOM
    if soft < needed:
        print(
            f"WARNING: open-files limit {soft} < {needed}: idle scenarios will fail "
            "(run through bench/run, which raises it)"
        )
    return soft


def describe(result: dict) -> str:
    if not result["ok"]:
        return f"FAILED: {result['error']}"
    if "clients" in result:
        return (
            f"{result['connected']} connected in {result['connect_s']:.1f} s, "
            f"RSS {report.fmt(result.get('rss_mib'))} MiB"
        )
    latency = result.get("latency_ms", {})
    text = f"{report.fmt(result['tps'])} tps, p99 {report.fmt(latency.get('p99'))} ms"
    if "queue_wait_ms" in result:
        text += f", queue wait p99 {report.fmt(result['queue_wait_ms']['p99'])} ms"
    if result.get("pooler_cpu_s_per_1k") is not None:
        text += f", pooler CPU {report.fmt(result['pooler_cpu_s_per_1k'])} s/1k tx"
    return text


def run_all(args, selected, targets, ctx) -> list[dict]:
    """Every scenario, round by round, each target once per round in the given order."""
    plan = [
        (s, r, t)
        for s in selected
        for r in range(1, args.reps + 1)
        for t in targets
        if t.kind != "direct" or s.direct
    ]
    runs = []
    for number, (scenario, round_number, target) in enumerate(plan, 1):
        if target.unavailable:
            continue
        label = f"{scenario.name}-{target.name}-r{round_number}"
        print(f"[{number}/{len(plan)}] {label}: ", end="", flush=True)
        try:
            auth_file = ctx.workdir / scenario.auth_file
            target.start(ctx.cluster, overrides={"auth_file": auth_file}
                         if scenario.auth_file != poolers.USERLIST else None)
        except poolers.PoolerError as error:
            target.unavailable = f"failed to start: {error}"
            print(f"SKIPPING {target.name} from now on, it failed to start:\n{error}")
            continue
        try:
            result = scenarios.run(scenario, target, ctx, label)
        finally:
            target.stop()
        result["round"] = round_number
        runs.append(result)
        print(describe(result))
        time.sleep(1)  # let closed connections and exiting backends settle
    return runs


def main() -> None:
    args = parse_args()
    selected = [s for s in scenarios.SCENARIOS if not args.only or s.name in args.only]
    fd_limit = check_fd_limit(selected)
    if args.workers and "pypool" not in args.poolers:
        print("note: --workers applies to pypool, which is not in --poolers")

    pgbouncer_binary, pgbouncer_version, pgbouncer_how = pgbouncer_build.OS_BINARY, None, ""
    if "pgbouncer" in args.poolers:
        pgbouncer_binary, pgbouncer_version, pgbouncer_how = pgbouncer_build.resolve(CACHE)
        print(
            f"Comparing against PgBouncer {pgbouncer_build.version_text(pgbouncer_version)}: "
            f"{pgbouncer_binary} ({pgbouncer_how})"
        )
    has_prepared = bool(pgbouncer_version and pgbouncer_version >= pgbouncer_build.MIN_VERSION)

    host = machine()  # before the run, for its load average
    stamp = datetime.datetime.now(datetime.UTC)
    rawdir = RESULTS / "raw" / stamp.strftime("%Y%m%dT%H%M%SZ")
    rawdir.mkdir(parents=True)
    workdir = Path(tempfile.mkdtemp(prefix="pypool-bench-"))
    workdir.chmod(0o755)  # the postgres user works in here too
    cluster = pg_cluster.Cluster(
        bindir=pg_cluster.newest_bindir(),
        workdir=workdir,
        port=poolers.free_port(),
        user="bench",
        password="bench-password",
        dbname="bench",
    )
    targets: list[poolers.Target] = []
    try:
        print(
            f"PostgreSQL {cluster.version()}: initdb in {workdir}, port {cluster.port}, "
            f"pgbench -i -s {PGBENCH_SCALE} ...",
            flush=True,
        )
        cluster.create()
        cluster.load_pgbench(PGBENCH_SCALE)
        targets = poolers.make_targets(
            args.poolers, args.workers, args.pipeline_depth, cluster, workdir,
            pgbouncer_binary, has_prepared,
        )
        ctx = scenarios.Context(cluster, workdir, rawdir, args.duration)
        runs = run_all(args, selected, targets, ctx)
    finally:
        for target in targets:
            target.stop()
            if target.logfile and target.logfile.exists():
                shutil.copy(target.logfile, rawdir)
        if cluster.logfile.exists():
            shutil.copy(cluster.logfile, rawdir)
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    names = [target.name for target in targets]
    order = ", ".join(names)
    meta = {
        "date": stamp.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": host,
        "versions": {
            "PostgreSQL": cluster.version(),
            "PgBouncer": pgbouncer_build.version_text(pgbouncer_version),
            "pypool": pypool_version(),
            "Python": f"{platform.python_version()} ({sys.executable})",
            "uvloop": package_version("uvloop"),
        },
        "pgbouncer": f"{pgbouncer_binary} ({pgbouncer_how or 'not run'})",
        "settings": (
            f"{args.duration} s per pgbench run, {args.reps} round(s) alternating {order}, "
            f"fresh pooler process per run; pool_mode=transaction, "
            f"default_pool_size={poolers.DEFAULT_POOL_SIZE}, max_client_conn=12000, "
            f"max_prepared_statements={poolers.MAX_PREPARED_STATEMENTS} "
            f"({'both' if has_prepared else 'pypool only: PgBouncer < 1.21'}), "
            f"auth_type=scram-sha-256; PostgreSQL fsync=off, max_connections=300; "
            f"pgbench scale {PGBENCH_SCALE}; open-files limit {fd_limit}"
        ),
        "command": " ".join(["bench/run", *sys.argv[1:]]),
        "skipped": {t.name: t.unavailable.splitlines()[0] for t in targets if t.unavailable},
        "raw": str(rawdir.relative_to(BENCH.parent)),
    }
    summary = report.summarize(runs, selected, names)
    report.write_json(RESULTS / "latest.json", meta, selected, runs, summary)
    report.write_markdown(RESULTS / "latest.md", meta, selected, runs, summary)
    try:
        report.write_chart(RESULTS / "latest.png", selected, summary, names)
    except ImportError:
        print("WARNING: matplotlib is not installed; no chart written")
    print()
    print((RESULTS / "latest.md").read_text())
    print(f"Written: {RESULTS}/latest.md, latest.json, latest.png; raw output in {rawdir}")


if __name__ == "__main__":
    main()
