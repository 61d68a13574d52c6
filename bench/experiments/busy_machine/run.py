"""The "busy benchmark" pitfall: the same workload on a quiet machine and on a busy one.

    python3 bench/experiments/busy_machine/run.py [--seconds 8] [--rounds 3] [--hogs 2] [--pin]

A benchmark's TPS says as much about the machine as about the pooler: let something else
take CPU and TPS falls, through whichever pooler. The pooler's own CPU per transaction
(its user + system time from /proc over the run, divided by the transactions) is what it
costs to relay one, and moves far less. One throwaway PostgreSQL (bench/pg_cluster.py,
`pgbench -i -s 1`); pypool from this checkout and PgBouncer from the same pgbouncer.ini
(bench/poolers.py), a fresh pooler per run; `pgbench -S -M simple -c 50 -j 4` for
--seconds. Each round runs both poolers quiet, then both busy: while pgbench runs,
--hogs CPU hogs (`python3 -c 'while 1: pass'`, each in a session of its own as another
program would be; with --pin each held to one CPU; with --share-session in pgbench's
session) compete for the machine's CPUs, and are stopped when it ends.

Writes data.json, result.md and (with matplotlib) chart.png beside this file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent)]  # side_by_side.py, bench/

import procstats  # noqa: E402
import scenarios  # noqa: E402
import side_by_side as sbs  # noqa: E402

SCALE = 1
NAMES = {"pypool": "pypool", "pgbouncer": "PgBouncer"}
CONDITIONS = ("quiet", "busy")
KEYS = ("tps", "pooler_cpu_us_per_tx", "latency_ms.p50", "latency_ms.p99", "machine_busy_pct",
        "hog_cpu_s", "pg_cpu_s_per_1k")


def hogs(count: int, pin: bool, share_session: bool
         ) -> Callable[[], Callable[[], dict[str, float]]]:
    """What starts ``count`` CPU hogs and returns what stops them and says how much CPU they
    took (side_by_side.measure's ``during``). Each hog is a session of its own, as another
    program on the machine would be, unless ``share_session``: Linux's autogroup scheduling
    shares the CPUs between sessions first, so hogs in pgbench's session take their CPU from
    pgbench above all."""

    def start() -> Callable[[], dict[str, float]]:
        cpus = sorted(os.sched_getaffinity(0))
        procs = []
        for number in range(count):
            proc = subprocess.Popen([sys.executable, "-c", "while 1: pass"],
                                    start_new_session=not share_session)
            if pin:
                os.sched_setaffinity(proc.pid, {cpus[number % len(cpus)]})
            procs.append(proc)

        def stop() -> dict[str, float]:
            used = sum(procstats.cpu_seconds(proc.pid) for proc in procs)
            for proc in procs:
                proc.terminate()
                proc.wait(10)
            return {"hog_cpu_s": used}

        return stop

    return start


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Medians over the rounds, per pooler and condition."""
    return {target: {condition: {key: sbs.median_of(
        [r for r in runs if r["target"] == target and r["condition"] == condition], key)
        for key in KEYS} for condition in CONDITIONS} for target in NAMES}


def chart(runs: list[dict[str, Any]], medians: dict, path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.3))
    panels = (("tps", "TPS"), ("pooler_cpu_us_per_tx", "pooler CPU per transaction (us)"),
              ("latency_ms.p99", "latency p99 (ms)"))
    for axis, (key, label) in zip(axes, panels, strict=True):
        for t_index, target in enumerate(NAMES):
            for c_index, condition in enumerate(CONDITIONS):
                x = t_index * 3 + c_index
                value = medians[target][condition][key]
                axis.bar(x, value or 0, 0.8, color=f"C{t_index}",
                         alpha=0.35 if condition == "busy" else 0.75,
                         hatch="xx" if condition == "busy" else None)
                rounds = [sbs.median_of([r], key) for r in runs
                          if r["target"] == target and r["condition"] == condition]
                axis.plot([x] * len(rounds), rounds, "k.", markersize=6)
            quiet = medians[target]["quiet"][key]
            busy = medians[target]["busy"][key]
            if quiet and busy:
                top = max([busy, *(sbs.median_of([r], key) or 0 for r in runs
                                   if r["target"] == target and r["condition"] == "busy")])
                axis.annotate(f"x{busy / quiet:.2f}", (t_index * 3 + 1, top),
                              textcoords="offset points", xytext=(0, 4), ha="center",
                              fontsize=9)
        axis.set_xticks([0, 1, 3, 4], [f"{NAMES[t]}\n{c}" for t in NAMES for c in CONDITIONS],
                        fontsize=8)
        axis.set_ylabel(label)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(medians: dict, target: str, key: str) -> str:
    quiet, busy = medians[target]["quiet"][key], medians[target]["busy"][key]
    return f"x{busy / quiet:.2f}" if quiet and busy else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=8, help="per pgbench run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=2, help="CPU hogs while busy")
    parser.add_argument("--pin", action="store_true", help="hold each hog to one CPU")
    parser.add_argument("--share-session", action="store_true",
                        help="start the hogs in pgbench's session, not each in its own")
    parser.add_argument("--pgbouncer", help="the PgBouncer binary (default: bench/'s)")
    parser.add_argument("--out", default=str(HERE))
    parser.add_argument("--report-only", action="store_true",
                        help="write result.md and chart.png again from --out's data.json")
    args = parser.parse_args()
    out = Path(args.out)
    if not args.report_only:
        (out / "data.json").write_text(json.dumps(measure(args), indent=1) + "\n")
    report(json.loads((out / "data.json").read_text()), out)
    print((out / "result.md").read_text())


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Each round: both poolers quiet, then both beside the hogs; and the medians."""
    workload = scenarios.Scenario("select-c50", "pgbench -S, 50 clients",
                                  ("-S", "-M", "simple", "-c", "50", "-j", "4"))
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    with sbs.side_by_side(args.seconds, SCALE, args.pgbouncer) as run:
        for round_number in range(1, args.rounds + 1):
            for condition in CONDITIONS:
                for target in run.targets:
                    during = (hogs(args.hogs, args.pin, args.share_session)
                              if condition == "busy" else None)
                    result = sbs.measure(run, workload, target,
                                         f"{target.name}-{condition}-r{round_number}", during)
                    result.update(round=round_number, condition=condition)
                    runs.append(result)
    return {
        "seconds": args.seconds, "rounds": args.rounds, "hogs": args.hogs, "pin": args.pin,
        "share_session": args.share_session, "scale": SCALE, "machine": run.machine,
        "versions": run.versions,
        "elapsed_s": round(time.monotonic() - started), "summary": summary(runs),
        "runs": [{key: value for key, value in r.items() if key != "command"} for r in runs],
    }


def report(data: dict[str, Any], out: Path) -> None:
    """result.md and chart.png from the data."""
    runs, medians = data["runs"], data["summary"]
    where = (", in pgbench's session" if data.get("share_session")
             else ", each in a session of its own")
    hog_text = (f"{data['hogs']} CPU hog{'s' if data['hogs'] != 1 else ''} "
                f"(`python3 -c 'while 1: pass'`"
                f"{', each pinned to one CPU' if data['pin'] else ''}"
                f"{where})")
    drawn = chart(runs, medians, out / "chart.png",
                  f"pgbench -S, 50 clients, pool of 20: quiet, and with {hog_text.split(' (')[0]}"
                  " running (bars: median, dots: rounds; xN: busy / quiet)")
    table = ["| pooler | machine | TPS | pooler CPU us/tx | PostgreSQL CPU us/tx | p50 ms | "
             "p99 ms | machine CPU busy | hogs' CPU s |", "|---|---|---|---|---|---|---|---|---|"]
    for target in NAMES:
        for condition in CONDITIONS:
            m = medians[target][condition]
            pg_us = m["pg_cpu_s_per_1k"] * 1000 if m["pg_cpu_s_per_1k"] is not None else None
            table.append(
                f"| {NAMES[target]} | {condition} | {fmt(m['tps'], 0)} | "
                f"{fmt(m['pooler_cpu_us_per_tx'])} | {fmt(pg_us)} | "
                f"{fmt(m['latency_ms.p50'], 2)} | {fmt(m['latency_ms.p99'], 2)} | "
                f"{fmt(m['machine_busy_pct'], 0)}% | {fmt(m['hog_cpu_s'])} |")
        table.append(f"| {NAMES[target]} | busy / quiet | {ratio(medians, target, 'tps')} | "
                     f"{ratio(medians, target, 'pooler_cpu_us_per_tx')} | "
                     f"{ratio(medians, target, 'pg_cpu_s_per_1k')} | "
                     f"{ratio(medians, target, 'latency_ms.p50')} | "
                     f"{ratio(medians, target, 'latency_ms.p99')} | | |")
    cross = []
    for condition in CONDITIONS:
        p, b = medians["pypool"][condition], medians["pgbouncer"][condition]
        if p["tps"] and b["tps"] and p["pooler_cpu_us_per_tx"] and b["pooler_cpu_us_per_tx"]:
            cross.append(f"| {condition} | {p['tps'] / b['tps']:.2f} | "
                         f"{p['pooler_cpu_us_per_tx'] / b['pooler_cpu_us_per_tx']:.2f} |")
    failed = [f"{r['target']}-{r['condition']}-r{r['round']}: {r['error']}"
              for r in runs if not r["ok"]]
    (out / "result.md").write_text(RESULT.format(
        seconds=data["seconds"], rounds=data["rounds"], hogs=hog_text,
        elapsed=data["elapsed_s"] / 60, machine=data["machine"],
        versions=", ".join(f"{k} {v}" for k, v in data["versions"].items()),
        table="\n".join(table), cross="\n".join(cross),
        failed="Failed runs, left out: " + "; ".join(failed) + "\n\n" if failed else "",
        notes=NOTES.get((data["seconds"], data["rounds"], data["hogs"], data["pin"],
                          bool(data.get("share_session"))), ""),
        chart="![TPS, pooler CPU per transaction and p99, quiet and busy](chart.png)\n"
        if drawn else "(no chart: matplotlib is not installed)\n"))


RESULT = """# The busy benchmark pitfall

`python3 bench/experiments/busy_machine/run.py`: `pgbench -S -M simple -c 50 -j 4` through a
pool of 20 server connections (transaction mode, SCRAM), {seconds} s per run, {rounds}
rounds; each round runs pypool then PgBouncer on the machine as it is ("quiet"), then both
again while {hogs} run beside them ("busy"). A fresh pooler process per run,
{elapsed:.1f} minutes in all. Medians over the rounds; the pooler's CPU (user + system) and
the machine's from /proc.

Machine: {machine}. Versions: {versions}.

{chart}
{table}

The two poolers compared, pypool / PgBouncer, in each condition:

| machine | TPS ratio | CPU per transaction ratio |
|---|---|---|
{cross}

{failed}How to read it. "Quiet" is the machine as it was: the benchmark itself (pgbench's
threads, PostgreSQL's backends and the pooler) keeps the CPUs busy, and other work on the
machine may run beside it. "Busy" adds the hogs. TPS is how many transactions the three got
through, so it falls with every CPU-second something else takes, through either pooler, and
the latency grows as each step of a transaction waits its turn for a CPU. The CPU per
transaction is the time the pooler (or PostgreSQL) itself spent on each transaction it
relayed; a neighbour adds to it only through the fixed costs of a run spread over fewer
transactions (the logins, the pooler's timers) and what it does to the CPU's caches. It is
the number to compare two poolers, or two versions of one, on a machine that is not yours
alone; TPS measured at different times or beside different neighbours is not comparable,
not even between the rounds of one run.
{notes}"""

# What a run showed, written after it (keyed by seconds, rounds, hogs, pin, share_session;
# shown below the generic text of a result with the same settings).
NOTES: dict[tuple[int, int, int, bool, bool], str] = {(8, 3, 2, False, False): """
This run (1 December 2026, 14:36 UTC; load average 9.4 before it, from other sessions'
benchmarks, builds and test suites on the machine). The machine was the busy benchmark
before any hog started: pypool's three "quiet" rounds gave 24,664, 12,464 and 13,277 TPS, a
factor of 2 between identical runs, while its CPU per transaction was 18.2, 18.4 and 20.6
us. With the hogs, TPS fell to x0.82 (pypool) and x0.77 (PgBouncer) of the quiet medians;
the pooler's CPU per transaction moved by x1.09 and x1.04, PostgreSQL's by x1.00 and x0.97.
pypool / PgBouncer: TPS 0.62 quiet and 0.66 busy, CPU per transaction 1.68 and 1.76.

An earlier run of the same command (14:33 UTC; its data is data-shared-session.json) started
the hogs in the script's own session, which is pgbench's. Linux shares the CPUs between
sessions first (autogroup scheduling; /proc/sys/kernel/sched_autogroup_enabled is 1 here),
so the hogs took their CPU from pgbench's share above all: they got only about 2.4
CPU-seconds a run, yet TPS halved (x0.52 pypool, x0.56 PgBouncer), as every transaction
waits for pgbench's threads. The pooler's CPU per transaction moved by x1.09 and x1.11. In
that run TPS said the two poolers were equal on the quiet machine (pypool / PgBouncer 1.02;
0.94 busy) while the CPU per transaction said 1.66 (1.63 busy). Where a neighbour runs, in
which session and on which CPU, decides what it takes from a benchmark; the CPU per
transaction hardly cared. `--share-session` starts the hogs that way again.
"""}


if __name__ == "__main__":
    main()
