"""A throwaway PostgreSQL cluster: initdb, configure, start, load pgbench data, stop.

PostgreSQL refuses to run as root, so when the harness is root the server programs run
as the OS user ``postgres``. The cluster lives in a temporary directory that the caller
deletes; it is tuned for benchmarking, not durability (``fsync = off``).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pgwire
import procstats

SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "300",
    "fsync": "off",
    "shared_buffers": "'512MB'",  # pgbench scale 10 (~160 MB) stays in memory
    "password_encryption": "'scram-sha-256'",
}


def newest_bindir() -> Path:
    """The bin directory of the newest PostgreSQL under /usr/lib/postgresql."""
    candidates = [
        path.parent
        for path in Path("/usr/lib/postgresql").glob("*/bin/initdb")
        if path.parent.parent.name.replace(".", "").isdigit()
    ]
    if not candidates:
        raise SystemExit("no PostgreSQL server found under /usr/lib/postgresql/*/bin")
    return max(candidates, key=lambda path: [int(p) for p in path.parent.name.split(".")])


def owner_kwargs() -> dict:
    """subprocess arguments that run a command as ``postgres`` when we are root."""
    return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}


@dataclass
class Cluster:
    """One PostgreSQL server on 127.0.0.1:``port`` with a superuser ``user``."""

    bindir: Path
    workdir: Path
    port: int
    user: str
    password: str
    dbname: str

    @property
    def datadir(self) -> Path:
        return self.workdir / "pgdata"

    @property
    def logfile(self) -> Path:
        return self.workdir / "postgresql.log"

    def _owner_run(self, *args: str | Path) -> None:
        completed = subprocess.run(
            [str(arg) for arg in args],
            cwd=self.workdir,
            capture_output=True,
            text=True,
            **owner_kwargs(),
        )
        if completed.returncode != 0:
            raise SystemExit(
                f"{' '.join(map(str, args))} failed ({completed.returncode}):\n"
                f"{completed.stdout}{completed.stderr}"
            )

    def create(self) -> None:
        """initdb with SCRAM authentication, write the settings, start the server."""
        socket_dir = self.workdir / "pgsocket"
        pwfile = self.workdir / "pwfile"
        socket_dir.mkdir()
        self.datadir.mkdir(mode=0o700)
        pwfile.write_text(self.password + "\n")
        self.logfile.touch()
        if os.geteuid() == 0:
            for path in (socket_dir, self.datadir, pwfile, self.logfile):
                shutil.chown(path, "postgres", "postgres")
        self._owner_run(
            self.bindir / "initdb",
            "-D",
            self.datadir,
            "-U",
            self.user,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        pwfile.unlink()
        settings = dict(SERVER_SETTINGS, port=str(self.port))
        settings["unix_socket_directories"] = f"'{socket_dir}'"
        with open(self.datadir / "postgresql.auto.conf", "a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        self._owner_run(
            self.bindir / "pg_ctl", "-D", self.datadir, "-l", self.logfile, "-w", "start"
        )

    def stop(self) -> None:
        if (self.datadir / "postmaster.pid").exists():
            self._owner_run(self.bindir / "pg_ctl", "-D", self.datadir, "-m", "fast", "-w", "stop")

    def postmaster_pid(self) -> int:
        return int((self.datadir / "postmaster.pid").read_text().split()[0])

    def cpu_seconds(self) -> float:
        """CPU used so far by the postmaster and all its (past and present) backends."""
        return procstats.cpu_seconds(self.postmaster_pid())

    def sql(self, *statements: str, dbname: str | None = None) -> list[tuple[str | None, ...]]:
        """Run statements directly against the server; return the last one's rows."""
        return asyncio.run(
            pgwire.run_sql(
                "127.0.0.1",
                self.port,
                self.user,
                self.password,
                dbname or self.dbname,
                *statements,
            )
        )

    def load_pgbench(self, scale: int) -> None:
        """Create the benchmark database and fill it with ``pgbench -i -s scale``."""
        self.sql(f'CREATE DATABASE "{self.dbname}"', dbname="postgres")
        subprocess.run(
            [str(self.bindir / "pgbench"), "-i", "-q", "-s", str(scale), *self.client_args()],
            env=self.client_env(),
            check=True,
            capture_output=True,
        )
        self.sql("VACUUM ANALYZE")

    def client_args(self, port: int | None = None) -> list[str]:
        """libpq connection arguments for pgbench, to the server or a pooler's port."""
        return ["-h", "127.0.0.1", "-p", str(port or self.port), "-U", self.user, self.dbname]

    def client_env(self, sslmode: str = "disable") -> dict[str, str]:
        """libpq's environment for the bench's clients: plaintext unless a scenario asks
        for TLS (the poolers accept both: poolers.tls_settings)."""
        return dict(os.environ, PGPASSWORD=self.password, PGSSLMODE=sslmode)

    def scram_secret(self) -> str:
        """The role's stored SCRAM secret, for a pooler's auth_file."""
        rows = self.sql(f"SELECT rolpassword FROM pg_authid WHERE rolname = '{self.user}'")
        return str(rows[0][0])

    def version(self) -> str:
        output = subprocess.run(
            [str(self.bindir / "postgres"), "--version"], capture_output=True, text=True
        ).stdout
        match = re.search(r"\d+(\.\d+)+", output)
        return match.group(0) if match else output.strip()
