"""A throwaway PostgreSQL cluster, made on demand.

`EmbeddedPostgres` runs `initdb` into a fresh directory, starts a postmaster on
127.0.0.1 and a port below the kernel's ephemeral range, and removes everything again
on `stop()`. The test suite uses it as the real server behind the pooler, and the CLI
can use it to give a newcomer something to pool without setting PostgreSQL up first.

It owns the cluster's directory (when it made it), the postmaster it started and
nothing else: it never touches a system cluster, never listens beyond loopback, and
is tuned for speed over durability (fsync off), so it must never hold data that
matters. The cluster enforces SCRAM-SHA-256 everywhere, as a production one would.

PostgreSQL refuses to run as root, so as root the directories belong to the
`postgres` OS user and `initdb`/`pg_ctl` run through `runuser -u postgres`.

Standard library only; `psycopg` is imported lazily by the SQL helpers.
"""

from __future__ import annotations

import glob
import os
import pwd
import random
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import urllib.parse
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from psycopg.sql import SQL, Composed

PG_OS_USER = "postgres"

# Ports at or above 32768 belong to Linux's default ephemeral range
# (net.ipv4.ip_local_port_range), where outgoing connections -- including the
# pooler's own connections to the server -- take their source ports from.
_PORT_RANGE = (15000, 32000)

# sun_path is 108 bytes on Linux, and PostgreSQL refuses longer socket paths.
_MAX_SOCKET_PATH = 107

StopMode = Literal["smart", "fast", "immediate"]


def find_pg_bindir() -> str:
    """The directory holding PostgreSQL's server programs (initdb, pg_ctl, pgbench).

    `PYPOOL_PG_BINDIR` wins when set; otherwise the newest `/usr/lib/postgresql/*/bin`
    with an `initdb` in it (Debian/Ubuntu layout); otherwise wherever `initdb` is on
    PATH.
    """
    override = os.environ.get("PYPOOL_PG_BINDIR")
    if override:
        if not os.access(os.path.join(override, "initdb"), os.X_OK):
            raise FileNotFoundError(f"PYPOOL_PG_BINDIR={override!r} has no executable initdb")
        return override

    def version_key(bindir: str) -> tuple[int, ...]:
        # "/usr/lib/postgresql/15/bin" -> (15,); "9.6" -> (9, 6); non-numeric sorts first
        name = os.path.basename(os.path.dirname(bindir))
        try:
            return tuple(int(part) for part in name.split("."))
        except ValueError:
            return (-1,)

    candidates = [
        os.path.dirname(path)
        for path in glob.glob("/usr/lib/postgresql/*/bin/initdb")
        if os.access(path, os.X_OK)
    ]
    if candidates:
        return max(candidates, key=version_key)
    on_path = shutil.which("initdb")
    if on_path:
        return os.path.dirname(os.path.realpath(on_path))
    raise FileNotFoundError(
        "no PostgreSQL server binaries found: install the postgresql package "
        "or set PYPOOL_PG_BINDIR to the directory holding initdb"
    )


def free_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A TCP port on `host` that nothing listens on now, below the ephemeral range.

    Random in 15000-32000 so that parallel runs rarely collide; checked by binding.
    Another process can still take it before the caller does.
    """
    for _ in range(attempts):
        port = random.randint(*_PORT_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port on {host} in {_PORT_RANGE} after {attempts} tries")


def wait_listening(port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
    """Return once something accepts connections on host:port (a pooler the harnesses just
    started); RuntimeError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {host}:{port}") from None
            time.sleep(0.1)


def _running_as_root() -> bool:
    return os.geteuid() == 0


def _ensure_pg_os_user() -> pwd.struct_passwd:
    """The `postgres` OS account, created as a system user if the package did not."""
    try:
        return pwd.getpwnam(PG_OS_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                PG_OS_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(PG_OS_USER)


def _world_traversable(path: str) -> bool:
    """Whether every directory from / down to `path` lets other users through."""
    path = os.path.realpath(path)
    while True:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


class EmbeddedPostgres:
    """One private PostgreSQL cluster: `start()` makes and runs it, `stop()` ends it.

    Usable as a context manager. `port` is fixed at construction, so `restart()`
    brings the server back where clients (and a pooler) expect it.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        basedir: str | None = None,
        port: int | None = None,
        superuser: str = "postgres",
        password: str | None = None,
    ) -> None:
        self.bindir = find_pg_bindir()
        self.port = port if port is not None else free_port(self.host)
        self.superuser = superuser
        self.password = password if password is not None else secrets.token_urlsafe(18)
        if "\n" in self.password or "\r" in self.password:
            raise ValueError("the superuser password cannot contain a line break")
        self._as_root = _running_as_root()
        self._owns_basedir = basedir is None
        if basedir is None:
            parent = tempfile.gettempdir()
            if self._as_root and not _world_traversable(parent):
                parent = "/tmp"  # the postgres user must be able to reach the datadir
            basedir = tempfile.mkdtemp(prefix="pypool-pg-", dir=parent)
            os.chmod(basedir, 0o755)
        else:
            os.makedirs(basedir, mode=0o755, exist_ok=True)
        self.basedir = os.path.abspath(basedir)
        self.datadir = os.path.join(self.basedir, "data")
        self.socket_dir = os.path.join(self.datadir, "sockets")
        self.log_path = os.path.join(self.datadir, "postgresql.log")
        self._removed = False
        socket_path = os.path.join(self.socket_dir, f".s.PGSQL.{self.port}")
        if len(socket_path.encode()) > _MAX_SOCKET_PATH:
            raise ValueError(f"basedir {self.basedir!r} is too long for a Unix socket path")
        if self._as_root:
            pg_user = _ensure_pg_os_user()
            os.chown(self.basedir, pg_user.pw_uid, pg_user.pw_gid)

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<EmbeddedPostgres {self.host}:{self.port} {self.datadir} {state}>"

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> EmbeddedPostgres:
        """Create the cluster if needed and start it; returns self. A no-op if running."""
        if self._removed:
            raise RuntimeError("this cluster was removed by stop(); make a new EmbeddedPostgres")
        if not os.path.exists(os.path.join(self.datadir, "PG_VERSION")):
            self._initdb()
        if self.is_running:
            return self
        proc = self._run(
            [
                self.tool("pg_ctl"),
                "-w",
                "-t",
                "60",
                "-D",
                self.datadir,
                "-l",
                self.log_path,
                "start",
            ],
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"pg_ctl start failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
                f"\n--- {self.log_path} ---\n{self.log()}"
            )
        return self

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server, then remove the directory if this object created it."""
        self._pg_ctl_stop(mode)
        if self._owns_basedir and not self._removed:
            shutil.rmtree(self.basedir, ignore_errors=True)
            self._removed = True

    def restart(self, mode: StopMode = "fast", keep_commits: bool = True) -> None:
        """Stop (`-m fast`, or `immediate` to simulate a crash) and start on the same port.

        The directory is kept, and clients connected at the time lose their
        connections, which is what fault tests want. With synchronous_commit=off an
        immediate stop would also drop the last fraction of a second of commits (the
        WAL writer had not written them yet), so by default a CHECKPOINT runs first;
        `keep_commits=False` skips it for a crash as real as this cluster allows.
        """
        if mode == "immediate" and keep_commits and self.is_running:
            try:
                self.execute("CHECKPOINT")
            except Exception:  # best effort: a wedged server still gets restarted
                pass
        self._pg_ctl_stop(mode)
        self.start()

    @property
    def is_running(self) -> bool:
        if not os.path.exists(os.path.join(self.datadir, "PG_VERSION")):
            return False
        proc = self._run([self.tool("pg_ctl"), "-D", self.datadir, "status"], check=False)
        return proc.returncode == 0  # 3 means "no server running"

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses and files -------------------------------------------------------

    def dsn(
        self, dbname: str = "postgres", user: str | None = None, password: str | None = None
    ) -> str:
        """A libpq URL for this server; the superuser and its password by default."""
        user = self.superuser if user is None else user
        password = self.password if password is None else password
        quote = urllib.parse.quote
        return (
            f"postgresql://{quote(user, safe='')}:{quote(password, safe='')}"
            f"@{self.host}:{self.port}/{quote(dbname, safe='')}"
        )

    def tool(self, name: str) -> str:
        """Path of a program from the same PostgreSQL installation (pgbench, psql...)."""
        return os.path.join(self.bindir, name)

    def log(self) -> str:
        """The server log so far ('' if there is none yet)."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    # -- SQL helpers (need psycopg) ------------------------------------------------

    def execute(
        self, sql: str | SQL | Composed, dbname: str = "postgres", params: Any = None
    ) -> list[tuple[Any, ...]] | None:
        """Run one statement as the superuser, in autocommit; rows, or None if none."""
        import psycopg

        with psycopg.connect(self.dsn(dbname), autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(sql, params)
            if cur.description is None:
                return None
            return cur.fetchall()

    def create_role(self, name: str, password: str, superuser: bool = False) -> None:
        """CREATE ROLE ... LOGIN with a password stored as a SCRAM-SHA-256 verifier."""
        from psycopg import sql

        self.execute(
            sql.SQL("CREATE ROLE {} LOGIN {} PASSWORD {}").format(
                sql.Identifier(name),
                sql.SQL("SUPERUSER" if superuser else "NOSUPERUSER"),
                sql.Literal(password),
            )
        )

    def scram_verifier(self, role: str) -> str:
        """`pg_authid.rolpassword` of `role`: the secret a userlist.txt may carry."""
        rows = self.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", params=(role,))
        if not rows or rows[0][0] is None:
            raise KeyError(f"role {role!r} does not exist or has no password")
        return str(rows[0][0])

    # -- internals -------------------------------------------------------------------

    def _initdb(self) -> None:
        pwfile = os.path.join(self.basedir, "superuser.pw")
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.password + "\n")
        try:
            self._chown_to_pg(pwfile)
            proc = self._run(
                [
                    self.tool("initdb"),
                    "-D",
                    self.datadir,
                    "-U",
                    self.superuser,
                    "--pwfile",
                    pwfile,
                    "--auth=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ],
                check=False,
            )
        finally:
            os.unlink(pwfile)
        if proc.returncode != 0:
            raise RuntimeError(
                f"initdb failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )

        os.makedirs(self.socket_dir, mode=0o700, exist_ok=True)
        self._chown_to_pg(self.socket_dir)
        # initdb's pg_hba.conf already says scram-sha-256 for local, 127.0.0.1/32 and
        # ::1/128 (that is what --auth does); appended settings win over earlier ones.
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": "300",
            # two-phase commit usable, as on most production servers that pool behind pypool
            "max_prepared_transactions": "20",
            "password_encryption": "'scram-sha-256'",
            # durability is worthless for a throwaway cluster; speed is not
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            # pg_ctl -l sends stderr to postgresql.log in the datadir
            "logging_collector": "off",
            "log_destination": "'stderr'",
            "log_line_prefix": "'%m [%p] %q%u@%d '",
        }
        with open(os.path.join(self.datadir, "postgresql.conf"), "a", encoding="utf-8") as f:
            f.write("\n# added by pypool.embedded\n")
            for key, value in settings.items():
                f.write(f"{key} = {value}\n")

    def _pg_ctl_stop(self, mode: StopMode) -> None:
        if not self.is_running:
            return
        proc = self._run(
            [self.tool("pg_ctl"), "-w", "-t", "60", "-D", self.datadir, "-m", mode, "stop"],
            check=False,
        )
        if proc.returncode != 0 and self.is_running:
            raise RuntimeError(f"pg_ctl stop failed (exit {proc.returncode}):\n{proc.stderr}")

    def _chown_to_pg(self, path: str) -> None:
        if self._as_root:
            pg_user = pwd.getpwnam(PG_OS_USER)
            os.chown(path, pg_user.pw_uid, pg_user.pw_gid)

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a server program, as the postgres OS user when we are root."""
        if self._as_root:
            argv = ["runuser", "-u", PG_OS_USER, "--", *argv]
        # cwd: the postgres user may not be allowed into the caller's directory
        return subprocess.run(
            argv,
            cwd=self.basedir,
            check=check,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
