"""Follow queries through pypool with the protocol trace on (docs/lab/README.md, exercise 2).

    python3 bench/trace_one_query.py [--step N]

Starts a throwaway PostgreSQL and `pypool --trace` in front of it (two servers, trust
login), then plays four steps as raw protocol clients and prints, after each, the trace lines
the pooler wrote meanwhile (`source > target  message  what the pooler did`):

1. a simple Query, forwarded both ways;
2. a client's Parse of a named statement, rewritten to the pooler's own name;
3. the same client's Bind on a second server (another client holds the first): the pooler
   injects the Parse there and swallows its ParseComplete;
4. a client that logs in with TimeZone=Asia/Tokyo: the pooler's hidden SET, its replies
   swallowed.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pypool.embedded import EmbeddedPostgres, free_port, wait_listening  # noqa: E402
from pypool.protocol import messages as m  # noqa: E402


class Raw:
    """A blocking protocol client that reads every reply up to ReadyForQuery."""

    def __init__(self, port: int, **params: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""
        self.send(m.startup_message({"user": "app", "database": "app", **params}))
        self.until_ready()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def until_ready(self) -> list[int]:
        kinds = []
        while True:
            while len(self.buffer) < 5 or len(self.buffer) < 1 + int.from_bytes(
                    self.buffer[1:5], "big"):
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise EOFError("the pooler closed the connection")
                self.buffer += chunk
            end = 1 + int.from_bytes(self.buffer[1:5], "big")
            kind, self.buffer = self.buffer[0], self.buffer[end:]
            kinds.append(kind)
            if kind == m.READY_FOR_QUERY:
                return kinds

    def close(self) -> None:
        self.send(m.terminate())
        self.sock.close()

    def run(self, *messages: bytes) -> list[int]:
        self.send(b"".join(messages))
        return self.until_ready()


def parse(name: str, sql: str) -> bytes:
    return m.message(m.PARSE, m.cstring(name) + m.cstring(sql) + b"\0\0")


def bind(statement: str, value: str) -> bytes:
    data = value.encode()
    return m.message(m.BIND, m.cstring("") + m.cstring(statement) + b"\0\0\0\1"
                     + len(data).to_bytes(4, "big") + data + b"\0\0")


class Log:
    """The trace lines the pooler wrote since the last look."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen = 0

    def new_lines(self) -> list[str]:
        time.sleep(0.3)  # the pooler logs as it relays; give it the last reply's turn
        text = self.path.read_text(errors="replace")
        lines = text.splitlines()[self.seen:]
        self.seen += len(lines)
        return [line.split(" INFO ", 1)[1] for line in lines
                if " INFO " in line and " > " in line.split(" INFO ", 1)[1][:20]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step", type=int, default=0, help="print only this step's lines")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pypool-trace-"))
    pg = EmbeddedPostgres()
    pg.start()
    try:
        pg.create_role("app", "app-secret")
        pg.execute("CREATE DATABASE app OWNER app")
        port = free_port()
        # trust admits the users auth_file knows, as PgBouncer's does.
        (work / "userlist.txt").write_text('"app" ""\n')
        (work / "pypool.ini").write_text(
            f"[databases]\napp = host={pg.host} port={pg.port} dbname=app user=app "
            f"password=app-secret\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
            f"listen_port = {port}\nunix_socket_dir =\nauth_type = trust\n"
            f"auth_file = {work / 'userlist.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = 2\nlog_connections = 0\n"
            f"log_disconnections = 0\n")
        log = Log(work / "pypool.log")
        with open(log.path, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pypool", "--trace", str(work / "pypool.ini")],
                cwd=HERE.parent, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_listening(port)
            a, b = Raw(port), Raw(port)
            tokyo: list[Raw] = []
            log.new_lines()  # the two logins
            steps = [
                ("a simple Query", lambda: a.run(m.query("SELECT 1 AS one"))),
                ("a Parse of statement s1", lambda: a.run(parse("s1", "SELECT $1::int * 10"),
                                                          m.sync())),
                ("s1 bound on a second server", lambda: (
                    b.run(m.query("BEGIN")), a.run(bind("s1", "4"), m.execute(), m.sync()),
                    b.run(m.query("COMMIT")))),
                ("a client with TimeZone=Asia/Tokyo", lambda: (
                    tokyo.append(Raw(port, TimeZone="Asia/Tokyo")),
                    tokyo[0].run(m.query("SHOW TimeZone")))),
            ]
            for number, (title, play) in enumerate(steps, 1):
                play()
                lines = log.new_lines()
                if args.step in (0, number):
                    print(f"## step {number}: {title}")
                    print("\n".join(lines))
            for client in (a, b, *tokyo):
                client.close()
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
