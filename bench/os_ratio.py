"""A first ratio in two minutes: `pgbench -S -c 50 -T 20` through pypool and through the OS's
own PgBouncer (whatever `apt-get install pgbouncer` gave), the same ini for both, run
alternately three times each. The full side-by-side comparison is `bench/run`.

    python3 bench/os_ratio.py [--duration 20] [--reps 3] [--clients 50]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pypool.embedded import EmbeddedPostgres, free_port, wait_listening


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--clients", type=int, default=50)
    args = parser.parse_args()
    pgbouncer = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    work = Path(tempfile.mkdtemp(prefix="pypool-ratio-"))
    work.chmod(0o755)
    with EmbeddedPostgres() as pg:
        pg.create_role("bench", "bench-secret")
        pg.execute("CREATE DATABASE bench OWNER bench")
        env = dict(os.environ, PGPASSWORD="bench-secret")
        pgbench = pg.tool("pgbench")
        subprocess.run([pgbench, "-i", "-s", "10", "-q", "-h", pg.host, "-p", str(pg.port),
                        "-U", "bench", "bench"], env=env, check=True, capture_output=True)
        (work / "userlist.txt").write_text(f'"bench" "{pg.scram_verifier("bench")}"\n')
        ports = {"pypool": free_port(), "pgbouncer": free_port()}
        procs = {}
        for name, port in ports.items():
            ini = work / f"{name}.ini"
            ini.write_text(
                f"[databases]\nbench = host=127.0.0.1 port={pg.port} dbname=bench\n"
                f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
                f"auth_type = scram-sha-256\nauth_file = {work}/userlist.txt\n"
                "pool_mode = transaction\ndefault_pool_size = 20\nmax_client_conn = 1000\n"
                "unix_socket_dir =\nlogfile =\n"
            )
            ini.chmod(0o644)
            (work / "userlist.txt").chmod(0o644)
            if name == "pypool":
                cmd = [sys.executable, "-m", "pypool", "-q", str(ini)]
            else:
                cmd = ["runuser", "-u", "postgres", "--", pgbouncer, "-q", str(ini)]
            procs[name] = subprocess.Popen(cmd)
            wait_listening(port)
        version = subprocess.run([pgbouncer, "--version"], capture_output=True, text=True)
        print(f"PgBouncer: {version.stdout.splitlines()[0]}; PostgreSQL: {pg.bindir}")
        pids = {"pypool": procs["pypool"].pid,
                "pgbouncer": int(subprocess.run(["pgrep", "-n", "-x", "pgbouncer"],
                                                capture_output=True, text=True).stdout)}
        results: dict[str, list[float]] = {"pypool": [], "pgbouncer": []}
        try:
            for rep in range(args.reps):
                for name in ("pypool", "pgbouncer"):
                    before = cpu_seconds(pids[name])
                    run = subprocess.run(
                        [pgbench, "-S", "-c", str(args.clients), "-j", "2", "-T",
                         str(args.duration), "-h", "127.0.0.1", "-p", str(ports[name]),
                         "-U", "bench", "bench"], env=env, capture_output=True, text=True)
                    used = cpu_seconds(pids[name]) - before
                    tps = float(next(line for line in run.stdout.splitlines()
                                     if line.startswith("tps")).split()[2])
                    xacts = int(next(line for line in run.stdout.splitlines()
                                     if "processed" in line).split()[-1].split("/")[0])
                    results[name].append(tps)
                    print(f"run {rep + 1} {name:9s} {tps:9.0f} tps  "
                          f"{1000 * used / xacts:.4f} CPU s/1k tx", flush=True)
        finally:
            for proc in procs.values():
                proc.terminate()
            for proc in procs.values():
                proc.wait(10)
    shutil.rmtree(work, ignore_errors=True)
    pairs = [a / b for a, b in zip(results["pypool"], results["pgbouncer"], strict=True)]
    print("pypool/PgBouncer per pair: " + ", ".join(f"{r:.2f}" for r in pairs))


if __name__ == "__main__":
    main()
