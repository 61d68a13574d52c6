"""Pooler CPU per client login, without pgbench: a quick A/B for the login path.

    python3 bench/login_cpu.py [--logins 3000] [--clients 20] [--profile out.prof]
                               [--pgbouncer PATH] [--idle N]

Starts a throwaway PostgreSQL (pypool.embedded) with one SCRAM role, and pypool from this
checkout (PYTHONPATH; compiled modules are used when they are there, see
pypool/compiled.py), with that role's pg_authid verifier in its auth_file, as bench/run
does. Then `--clients` asyncio clients (bench/pgwire.py: PBKDF2 once per process, so the
client side is cheap) each log in, run `SELECT 1` and disconnect, `--logins` times in
all, and the pooler's CPU (/proc, user + system) over that is printed per login.
`--tree DIR` runs another checkout's pypool. `--pgbouncer PATH` measures that binary in
the same way after pypool. `--profile FILE` runs pypool under cProfile and writes its
stats to FILE (the CPU figure is then the profiler's, not the pooler's); `--perf FILE`
samples its CPU (`perf record -g`) over the measured logins. `--idle N`
instead opens N connections, keeps them, and prints the pooler's RSS before and after
(and /proc/PID/smaps_rollup). `--pgbench S` runs `pgbench -S -C` for S seconds instead
and adds pgbench's own CPU per transaction (its PBKDF2); `--plaintext` puts the password in
the auth_file instead of pg_authid's verifier, `--set 'key = value'` adds an ini line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pgwire
import procstats

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from pypool.embedded import (  # noqa: E402
    EmbeddedPostgres,
    find_pg_bindir,
    free_port,
    wait_listening,
)

USER, PASSWORD = "bench", "bench-secret"


def write_config(workdir: Path, pg: EmbeddedPostgres, port: int,
                 args: argparse.Namespace) -> Path:
    userlist = workdir / "userlist.txt"
    secret = PASSWORD if args.plaintext else pg.scram_verifier(USER)
    userlist.write_text(f'"{USER}" "{secret}"\n')
    ini = workdir / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"bench = host=127.0.0.1 port={pg.port} dbname=bench\n\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = scram-sha-256\nauth_file = {userlist}\n"
        "pool_mode = transaction\ndefault_pool_size = 20\nmax_client_conn = 12000\n"
        "log_connections = 0\nlog_disconnections = 0\n"
        + "".join(f"{setting}\n" for setting in args.set)
    )
    if os.geteuid() == 0:
        import pwd

        pw = pwd.getpwnam("postgres")
        for path in (workdir, userlist, ini):
            os.chown(path, pw.pw_uid, pw.pw_gid)
    return ini


async def one_login(port: int) -> None:
    conn = await pgwire.connect("127.0.0.1", port, USER, PASSWORD, "bench")
    await conn.query("SELECT 1")
    await conn.close()


async def logins(port: int, total: int, clients: int) -> None:
    left = [total]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            await one_login(port)

    await asyncio.gather(*(worker() for _ in range(clients)))


async def hold_idle(port: int, count: int, pid: int) -> None:
    gate = asyncio.Semaphore(100)

    async def open_one() -> pgwire.Connection:
        async with gate:
            conn = await pgwire.connect("127.0.0.1", port, USER, PASSWORD, "bench")
            await conn.query("SELECT 1")
            return conn

    before = procstats.rss_bytes(pid)
    conns = await asyncio.gather(*(open_one() for _ in range(count)))
    await asyncio.sleep(1.0)
    after = procstats.rss_bytes(pid)
    print(f"RSS before {before / 2**20:.1f} MiB, with {count} idle clients "
          f"{after / 2**20:.1f} MiB: {(after - before) / count / 1024:.2f} KiB per client")
    print(Path(f"/proc/{pid}/smaps_rollup").read_text())
    for conn in conns:
        await conn.close()


def workdir_of(command: list[str]) -> str:
    return str(Path(command[-1]).parent)


def user_system(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of `pid` and its live descendants (runuser's PgBouncer)."""
    user = system = 0
    for each in procstats.tree_pids(pid):
        fields = procstats.stat_fields(each)
        user, system = user + int(fields[11]), system + int(fields[12])
    return user / procstats.CLOCK_TICKS, system / procstats.CLOCK_TICKS


def pgbench(name: str, port: int, pid: int, args: argparse.Namespace) -> None:
    """`pgbench -S -C` (a SCRAM login per transaction, libpq's own PBKDF2) for
    `args.pgbench` seconds: TPS, and the CPU per transaction of the pooler and of pgbench."""
    command = [str(Path(find_pg_bindir()) / "pgbench"), "-n", "-S", "-C", "-M", "simple",
               "-c", str(args.clients), "-j", str(min(4, args.clients)),
               "-T", str(args.pgbench), "-h", "127.0.0.1", "-p", str(port), "-U", USER, "bench"]
    times0 = user_system(pid)
    child = subprocess.Popen(command, env=dict(os.environ, PGPASSWORD=PASSWORD),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert child.stdout is not None
    out = child.stdout.read()
    _, _, usage = os.wait4(child.pid, 0)  # pgbench's own CPU
    child.returncode = 0
    user, system = (b - a for a, b in zip(times0, user_system(pid), strict=True))
    lines = out.splitlines()
    if not any(line.startswith("tps =") for line in lines):
        raise SystemExit(f"pgbench failed:\n{out}")
    tx = int(next(line.split()[-1] for line in lines
                  if "transactions actually processed" in line).split("/")[0])
    tps = next(line.split()[2] for line in lines if line.startswith("tps ="))
    print(f"{name}: pgbench -S -C -c {args.clients}: {tps} tps, {tx} tx; CPU per tx: pooler "
          f"{(user + system) * 1e6 / tx:.0f} us, pgbench "
          f"{(usage.ru_utime + usage.ru_stime) * 1e6 / tx:.0f} us")


def measure(name: str, command: list[str], port: int, args: argparse.Namespace,
            env: dict[str, str] | None = None) -> None:
    proc = subprocess.Popen(command, env=env, cwd=workdir_of(command), stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_listening(port, timeout=20)
        asyncio.run(one_login(port))  # the pool is up, the first server logged in
        if args.idle:
            asyncio.run(hold_idle(port, args.idle, proc.pid))
            return
        if args.pgbench:
            pgbench(name, port, proc.pid, args)
            return
        asyncio.run(logins(port, 200, args.clients))  # warm up
        perf = None
        if args.perf:
            perf = subprocess.Popen(["perf", "record", "-q", "-F", "4000", "-g", "-o",
                                     os.path.abspath(args.perf), "-p", str(proc.pid)])
            time.sleep(0.5)
        times0, wall0 = user_system(proc.pid), time.monotonic()
        asyncio.run(logins(port, args.logins, args.clients))
        wall = time.monotonic() - wall0
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=60)
        user, system = (b - a for a, b in zip(times0, user_system(proc.pid), strict=True))
        per = 1e6 / args.logins
        print(f"{name}: {args.logins} logins in {wall:.2f} s ({args.logins / wall:.0f}/s), "
              f"pooler CPU {(user + system) * per:.0f} us per login "
              f"(user {user * per:.0f}, system {system * per:.0f})")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--logins", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--profile", help="write pypool's cProfile stats here")
    parser.add_argument("--perf", help="perf record -g the pooler during the logins, to here")
    parser.add_argument("--pgbouncer", help="also measure this PgBouncer binary")
    parser.add_argument("--idle", type=int, default=0, help="hold this many idle clients")
    parser.add_argument("--pgbench", type=int, default=0,
                        help="run pgbench -S -C this many seconds instead of the logins")
    parser.add_argument("--plaintext", action="store_true",
                        help="the auth_file holds the password, not pg_authid's verifier")
    parser.add_argument("--set", action="append", default=[],
                        help="an extra [pgbouncer] line, e.g. --set 'scram_iterations = 1024'")
    parser.add_argument("--tree", default=str(REPO),
                        help="the pypool checkout to run (default: this one)")
    args = parser.parse_args()
    with EmbeddedPostgres() as pg:
        pg.create_role(USER, PASSWORD)
        pg.execute(f"CREATE DATABASE bench OWNER {USER}")
        if args.pgbench:
            subprocess.run([pg.tool("pgbench"), "-i", "-q", "-s", "1", "-h", pg.host,
                            "-p", str(pg.port), "-U", USER, "bench"], check=True,
                           env=dict(os.environ, PGPASSWORD=PASSWORD), capture_output=True)
        with tempfile.TemporaryDirectory(prefix="pypool-login-") as tmp:
            workdir = Path(tmp)
            os.chmod(workdir, 0o755)
            port = free_port()
            ini = write_config(workdir, pg, port, args)
            env = dict(os.environ, PYTHONPATH=args.tree)
            python = [sys.executable]
            if args.profile:
                python += ["-m", "cProfile", "-o", os.path.abspath(args.profile)]
            measure("pypool", [*python, "-m", "pypool", str(ini)], port, args, env)
            if args.pgbouncer:
                port = free_port()
                ini = write_config(workdir, pg, port, args)
                command = [args.pgbouncer, str(ini)]
                if os.geteuid() == 0:
                    command = ["runuser", "-u", "postgres", "--", *command]
                measure("pgbouncer", command, port, args)


if __name__ == "__main__":
    main()
