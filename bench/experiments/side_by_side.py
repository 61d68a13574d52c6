"""pypool and PgBouncer side by side on one throwaway PostgreSQL, with bench/'s own harness.

The experiments that compare the two poolers (clients_200_on_20, busy_machine) start here.
bench/pg_cluster.py makes the cluster and loads pgbench's tables; bench/poolers.py starts
each pooler from the same pgbouncer.ini, a fresh process per run; bench/scenarios.py runs
pgbench and reads its TPS, its per-transaction latency log, and the pooler's and
PostgreSQL's CPU from /proc (bench/procstats.py). What this adds is the pooler's resident
memory sampled while the clients are connected (the harness reads it once, after pgbench
has finished) and the description of the machine and versions that a result states.
"""

from __future__ import annotations

import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import pg_cluster  # noqa: E402
import pgbouncer_build  # noqa: E402
import poolers  # noqa: E402
import scenarios  # noqa: E402

import bench as harness  # noqa: E402

MIB = 1024 * 1024
RSS_EVERY_S = 0.5  # a look at /proc costs a scan of its process list


@dataclass
class SideBySide:
    """The cluster, the two poolers (pypool first, as they alternate) and what they run."""

    cluster: pg_cluster.Cluster
    targets: list[poolers.Target]
    ctx: scenarios.Context
    versions: dict[str, str] = field(default_factory=dict)
    machine: str = ""


def pgbouncer_binary(given: str | None) -> tuple[Path, tuple[int, ...] | None]:
    """The PgBouncer to compare with: --pgbouncer, or the harness's (bench/README.md)."""
    if given:
        return Path(given), pgbouncer_build.binary_version(Path(given))
    binary, version, _how = pgbouncer_build.resolve(BENCH / ".cache")
    return binary, version


@contextmanager
def side_by_side(seconds: int, scale: int, pgbouncer: str | None) -> Iterator[SideBySide]:
    """A cluster loaded with ``pgbench -i -s scale`` and both poolers ready to start."""
    binary, version = pgbouncer_binary(pgbouncer)
    machine = harness.machine()  # before the cluster starts, for its load average
    workdir = Path(tempfile.mkdtemp(prefix="pypool-experiment-"))
    workdir.chmod(0o755)  # the postgres user works in here too
    cluster = pg_cluster.Cluster(
        bindir=pg_cluster.newest_bindir(), workdir=workdir, port=poolers.free_port(),
        user="bench", password="bench-password", dbname="bench")
    targets: list[poolers.Target] = []
    try:
        print(f"PostgreSQL {cluster.version()}: initdb, pgbench -i -s {scale} ...", flush=True)
        cluster.create()
        cluster.load_pgbench(scale)
        has_prepared = bool(version and version >= pgbouncer_build.MIN_VERSION)
        targets = poolers.make_targets(["pypool", "pgbouncer"], [], cluster, workdir, binary,
                                       has_prepared)
        rawdir = workdir / "raw"
        rawdir.mkdir()
        yield SideBySide(cluster, targets, scenarios.Context(cluster, workdir, rawdir, seconds),
                         versions={"PostgreSQL": cluster.version(),
                                   "PgBouncer": pgbouncer_build.version_text(version),
                                   "pypool": harness.pypool_version()},
                         machine=machine)
    finally:
        for target in targets:
            target.stop()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def measure(run: SideBySide, scenario: scenarios.Scenario, target: poolers.Target, label: str,
            during: Callable[[], Any] | None = None) -> dict[str, Any]:
    """One pgbench run against a freshly started pooler (bench/scenarios.py's measurements)
    and the pooler's RSS: at rest before the run, and the highest seen during it;
    the time pgbench took to log its clients in (its "initial connection time"); the share
    of the whole machine's CPU that was busy while pgbench ran (/proc/stat).

    ``during`` is called after the pooler has started and before pgbench does; what it
    returns is called (with no arguments) once pgbench has finished, to undo it; a dict
    that this returns goes into the run's result.
    """
    target.start(run.cluster)
    undo, undone = None, None
    try:
        time.sleep(0.5)  # the pooler settled, its servers not yet opened
        rest = target.rss_bytes() or 0
        peak = [rest]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(RSS_EVERY_S):
                peak[0] = max(peak[0], target.rss_bytes() or 0)

        sampler = threading.Thread(target=sample, daemon=True)
        undo = during() if during else None
        sampler.start()
        machine_before = machine_ticks()
        try:
            result = scenarios.run(scenario, target, run.ctx, label)
        finally:
            done.set()
            sampler.join()
        busy, total = (after - before for after, before in zip(machine_ticks(), machine_before,
                                                               strict=True))
        result["machine_busy_pct"] = 100 * busy / total if total else None
    finally:
        if undo:
            undone = undo()
        target.stop()
    if isinstance(undone, dict):
        result.update(undone)
    result["rss_rest_mib"] = rest / MIB
    result["rss_peak_mib"] = peak[0] / MIB
    raw = (run.ctx.rawdir / f"{label}.txt").read_text()
    connect = re.search(r"^initial connection time = ([0-9.]+) ms", raw, re.MULTILINE)
    result["connect_ms"] = float(connect.group(1)) if connect else None
    per_1k = result.get("pooler_cpu_s_per_1k")
    result["pooler_cpu_us_per_tx"] = per_1k * 1000 if per_1k is not None else None
    print(f"{label}: {harness.describe(result)}, RSS {rest / MIB:.1f} -> "
          f"{peak[0] / MIB:.1f} MiB", flush=True)
    if not result["ok"]:
        print(raw[-1500:], flush=True)
    time.sleep(1)  # let closed connections and exiting backends settle
    return result


def machine_ticks() -> tuple[int, int]:
    """The whole machine's busy and total CPU ticks so far (/proc/stat's cpu line)."""
    first = Path("/proc/stat").read_text().split("\n", 1)[0]
    fields = [int(value) for value in first.split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait (guest time is in user already: left out)
    return sum(fields) - idle, sum(fields)


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    """The median over runs of ``key`` (dotted for a nested one, ``latency_ms.p99``)."""
    values = []
    for run in runs:
        value: Any = run
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and run.get("ok"):
            values.append(float(value))
    return statistics.median(values) if values else None

