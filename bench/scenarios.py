"""The benchmark scenarios and how one run of each is measured.

Every run records what the harness can measure the same way for all targets: pgbench's
TPS, per-transaction latency percentiles from pgbench's ``--log`` files, the pooler's CPU
seconds per 1,000 transactions and RSS (from /proc, summed over its process tree), and
PostgreSQL's CPU per 1,000 transactions (the pooler can shift work onto the server).

pgbench threads (``-j``): the issue asks for ``-j`` equal to ``-c`` with the extended and
prepared protocols, so those use ``-j 100``. On a 2-core machine a thread per client
costs the client CPU that the pooler needs, so the other scenarios use
``-j min(4, clients)``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pg_cluster
import poolers

IDLE_SCRIPT = Path(__file__).resolve().parent / "idle_clients.py"
IDLE_CLIENTS_PER_PROCESS = 2500
SIMPLE_THREADS = 4
QUEUE_SLEEP_S = 0.05
MIB = 1024 * 1024


@dataclass(frozen=True)
class Scenario:
    """One workload. ``metric`` (a key of a run's results, dotted for nested ones) is its
    headline number for the pypool/PgBouncer ratio."""

    name: str
    description: str
    pgbench_args: tuple[str, ...] = ()
    script: str = ""  # a custom pgbench script (-f) instead of a builtin one
    idle_clients: int = 0  # an idle-connections scenario instead of pgbench
    before_sql: tuple[str, ...] = ()  # run directly on PostgreSQL before each run
    metric: str = "tps"
    higher_is_better: bool = True
    direct: bool = True  # also run against PostgreSQL without a pooler
    sslmode: str = "disable"  # libpq's PGSSLMODE for the clients ("require": over TLS)
    # The poolers' auth_file, in the run's directory: PLAIN_USERLIST holds the password
    # itself, which makes each SCRAM login "ad hoc" (the pooler derives the verifier).
    auth_file: str = poolers.USERLIST


def _select(mode: str, clients: int, threads: int) -> tuple[str, ...]:
    return ("-S", "-M", mode, "-c", str(clients), "-j", str(threads))


SCENARIOS = [
    *(
        Scenario(
            f"select-simple-c{clients}",
            f"pgbench -S (one primary-key SELECT per transaction), simple protocol, "
            f"{clients} client(s), -j {min(SIMPLE_THREADS, clients)}",
            _select("simple", clients, min(SIMPLE_THREADS, clients)),
        )
        for clients in (1, 20, 100, 200)
    ),
    Scenario(
        "select-extended-c100",
        "pgbench -S, extended protocol (Parse/Bind/Execute each time), 100 clients, -j 100",
        _select("extended", 100, 100),
    ),
    Scenario(
        "select-prepared-c100",
        "pgbench -S, named prepared statements (needs max_prepared_statements in "
        "transaction mode), 100 clients, -j 100",
        _select("prepared", 100, 100),
    ),
    Scenario(
        "tpcb-c20",
        "pgbench default TPC-B-like script (3 UPDATEs, SELECT, INSERT in a transaction), "
        "20 clients, -j 4",
        ("-M", "simple", "-c", "20", "-j", "4"),
        before_sql=("VACUUM pgbench_branches, pgbench_tellers", "TRUNCATE pgbench_history"),
    ),
    Scenario(
        "connect-c20",
        "pgbench -S -C: a new connection (SCRAM login) for every transaction, 20 clients, -j 4",
        ("-S", "-C", "-M", "simple", "-c", "20", "-j", "4"),
    ),
    Scenario(
        "connect-plain-c20",
        "pgbench -S -C with the password in plain text in the auth_file: each SCRAM login "
        "is ad hoc (the pooler must derive a verifier: PBKDF2 unless it keeps one), 20 "
        "clients, -j 4",
        ("-S", "-C", "-M", "simple", "-c", "20", "-j", "4"),
        direct=False,
        auth_file=poolers.PLAIN_USERLIST,
    ),
    Scenario(
        "queue-c100",
        f"100 clients each running SELECT pg_sleep({QUEUE_SLEEP_S}) against a pool of "
        f"{poolers.DEFAULT_POOL_SIZE}, -j 4; queue wait = latency - {QUEUE_SLEEP_S * 1000:.0f} ms",
        ("-M", "simple", "-c", "100", "-j", "4"),
        script=f"SELECT pg_sleep({QUEUE_SLEEP_S});\n",
        metric="queue_wait_ms.p99",
        higher_is_better=False,
    ),
    Scenario(
        "tls-select-simple-c100",
        "pgbench -S over TLS (PGSSLMODE=require; both poolers present the same self-signed "
        "RSA 2048 certificate; plaintext to PostgreSQL), simple protocol, 100 clients, -j 4",
        _select("simple", 100, SIMPLE_THREADS),
        direct=False,
        sslmode="require",
    ),
    Scenario(
        "tls-connect-c20",
        "pgbench -S -C over TLS: a TLS handshake and a SCRAM login for every transaction, "
        "20 clients, -j 4",
        ("-S", "-C", "-M", "simple", "-c", "20", "-j", "4"),
        direct=False,
        sslmode="require",
    ),
    *(
        Scenario(
            f"idle-{clients}",
            f"{clients:,} clients log in (SCRAM), run SELECT 1 and stay idle; pooler RSS "
            f"once all are connected (not run direct: max_connections is 300)",
            idle_clients=clients,
            metric="rss_mib",
            higher_is_better=False,
            direct=False,
        )
        for clients in (1000, 10000)
    ),
]
BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}


@dataclass
class Context:
    """What every run needs besides the scenario and the target."""

    cluster: pg_cluster.Cluster
    workdir: Path
    rawdir: Path
    duration: int


def percentiles(values: list[float]) -> dict[str, float]:
    """avg, p50, p95, p99 and max (nearest-rank) of a non-empty list."""
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]

    return {
        "avg": sum(ordered) / len(ordered),
        "p50": rank(50),
        "p95": rank(95),
        "p99": rank(99),
        "max": ordered[-1],
    }


def _read_latencies_ms(logdir: Path) -> list[float]:
    """Per-transaction latencies from pgbench --log files (3rd column, microseconds)."""
    latencies = []
    for log in logdir.glob("tx*"):
        with open(log) as lines:
            for line in lines:
                fields = line.split()
                if len(fields) > 2 and fields[2].isdigit():
                    latencies.append(int(fields[2]) / 1000)
    return latencies


SUMMARY_PATTERNS = {
    "tps": r"^tps = ([0-9.]+)",
    "transactions": r"^number of transactions actually processed: ([0-9]+)",
    "failed": r"^number of failed transactions: ([0-9]+)",
}


def _pgbench_summary(stdout: str) -> dict[str, float]:
    """TPS and transaction counts from pgbench's closing report."""
    summary = {}
    for key, pattern in SUMMARY_PATTERNS.items():
        match = re.search(pattern, stdout, re.MULTILINE)
        if match:
            summary[key] = float(match.group(1))
    return summary


def _per_1k(cpu_before: float | None, cpu_after: float | None, count: int) -> float | None:
    if cpu_before is None or cpu_after is None or count <= 0:
        return None
    return (cpu_after - cpu_before) / count * 1000


def run(scenario: Scenario, target: poolers.Target, ctx: Context, label: str) -> dict:
    """Run the scenario once against an already started target; return the measurements."""
    result = {"scenario": scenario.name, "target": target.name, "ok": False, "error": ""}
    if scenario.idle_clients:
        result.update(_run_idle(scenario, target, ctx))
    else:
        result.update(_run_pgbench(scenario, target, ctx, label))
    if not target.alive():
        result["ok"] = False
        result["error"] = (result["error"] + f"; {target.name} died during the run").lstrip("; ")
    return result


def _run_pgbench(scenario: Scenario, target: poolers.Target, ctx: Context, label: str) -> dict:
    cluster = ctx.cluster
    logdir = Path(tempfile.mkdtemp(prefix="pgbench-log-", dir=ctx.workdir))
    command = [str(cluster.bindir / "pgbench"), "-n", "-T", str(ctx.duration)]
    command += [*scenario.pgbench_args, "-l", f"--log-prefix={logdir}/tx"]
    if scenario.script:
        script = ctx.workdir / f"{scenario.name}.sql"
        script.write_text(scenario.script)
        command += ["-f", str(script)]
    command += cluster.client_args(target.port)

    if scenario.before_sql:
        cluster.sql(*scenario.before_sql)
    pooler_cpu, pg_cpu = target.cpu_seconds(), cluster.cpu_seconds()
    try:
        completed = subprocess.run(
            command,
            env=cluster.client_env(scenario.sslmode),
            capture_output=True,
            text=True,
            timeout=ctx.duration + 120,
        )
        stdout, stderr, returncode = completed.stdout, completed.stderr, completed.returncode
    except subprocess.TimeoutExpired:
        stdout, stderr, returncode = "", f"pgbench still running after {ctx.duration + 120} s", -1
    pooler_cpu_after, pg_cpu_after = target.cpu_seconds(), cluster.cpu_seconds()
    rss = target.rss_bytes()
    (ctx.rawdir / f"{label}.txt").write_text(
        f"$ {' '.join(command)}\nexit {returncode}\n\n{stdout}\n--- stderr ---\n{stderr}"
    )
    latencies = _read_latencies_ms(logdir)
    shutil.rmtree(logdir)

    summary = _pgbench_summary(stdout)
    transactions = int(summary.get("transactions", 0))
    measured: dict = {
        "command": " ".join(command),
        "tps": summary.get("tps"),
        "transactions": transactions,
        "failed_transactions": int(summary.get("failed", 0)),
        "pooler_cpu_s_per_1k": _per_1k(pooler_cpu, pooler_cpu_after, transactions),
        "pg_cpu_s_per_1k": _per_1k(pg_cpu, pg_cpu_after, transactions),
        "rss_mib": rss / MIB if rss is not None else None,
    }
    if latencies:
        measured["latency_ms"] = percentiles(latencies)
        if scenario.script:
            sleep_ms = QUEUE_SLEEP_S * 1000
            waits = [max(0.0, latency - sleep_ms) for latency in latencies]
            measured["queue_wait_ms"] = percentiles(waits)
    if returncode != 0 or not transactions:
        errors = [line for line in stderr.splitlines() if line.strip()]
        measured["error"] = f"pgbench exit {returncode}: " + " | ".join(errors[-3:])[:500]
    else:
        measured["ok"] = True
    return measured


def _run_idle(scenario: Scenario, target: poolers.Target, ctx: Context) -> dict:
    cluster = ctx.cluster
    rss_before, cpu_before = target.rss_bytes(), target.cpu_seconds()
    counts = [IDLE_CLIENTS_PER_PROCESS] * (scenario.idle_clients // IDLE_CLIENTS_PER_PROCESS)
    if scenario.idle_clients % IDLE_CLIENTS_PER_PROCESS:
        counts.append(scenario.idle_clients % IDLE_CLIENTS_PER_PROCESS)
    children = [
        subprocess.Popen(
            [
                sys.executable,
                str(IDLE_SCRIPT),
                "--port",
                str(target.port),
                "--user",
                cluster.user,
                "--dbname",
                cluster.dbname,
                "--count",
                str(count),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=cluster.client_env(),
        )
        for count in counts
    ]
    reports = []
    for child in children:
        assert child.stdout is not None
        line = child.stdout.readline()
        reports.append(json.loads(line) if line else {"ok": 0, "error": "client process died"})
    time.sleep(1)  # let the pooler finish its bookkeeping for the last logins
    rss_after, cpu_after = target.rss_bytes(), target.cpu_seconds()
    for child in children:
        assert child.stdin is not None
        child.stdin.close()
    for child in children:
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    connected = sum(report.get("ok", 0) for report in reports)
    measured: dict = {
        "clients": scenario.idle_clients,
        "connected": connected,
        "connect_s": max(report.get("seconds", 0.0) for report in reports),
        "pooler_cpu_s_per_1k": _per_1k(cpu_before, cpu_after, connected),
    }
    if rss_before is not None and rss_after is not None:
        measured["rss_before_mib"] = rss_before / MIB
        measured["rss_mib"] = rss_after / MIB
        if connected:
            measured["kib_per_client"] = (rss_after - rss_before) / 1024 / connected
    errors = [report["error"] for report in reports if report.get("error")]
    if connected == scenario.idle_clients:
        measured["ok"] = True
    else:
        measured["error"] = f"{connected}/{scenario.idle_clients} connected: {errors[:1]}"
    return measured
