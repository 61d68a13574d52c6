"""How much memory prepared statements cost the pooler: RSS growth of a pypool process when
1,000 clients each prepare 200 distinct statements (200,000 in all).

    python3 bench/prepared_memory.py [--clients 1000] [--statements 200]

Starts a throwaway PostgreSQL (pypool.embedded) and a pypool (transaction mode, pool of 20,
max_prepared_statements 200, clients authenticated by `trust` so that 1,000 logins stay
cheap), connects the clients, and reads the pooler's VmRSS from /proc: after the clients are
in (idle), after each has parsed its statements (Parse x N, Sync), and after they have all
left. Every statement is a different query text, so each one is a pooler-wide entry of its
own; each server keeps at most max_prepared_statements of them. The totals come from the
admin console (SHOW CLIENTS / SHOW SERVERS, column prepared_statements).

Prints one line per measurement and a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pypool.embedded import EmbeddedPostgres, free_port  # noqa: E402


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


class Client:
    """Just enough protocol: a trust login, Parse, Sync, simple queries, Terminate."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int, user: str, database: str) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = struct.pack("!I", 196608) + b"user\0" + user.encode() + b"\0database\0"
        body += database.encode() + b"\0\0"
        writer.write(struct.pack("!I", len(body) + 4) + body)
        client = cls(reader, writer)
        await client.until_ready()
        return client

    async def read(self) -> tuple[bytes, bytes]:
        header = await self.reader.readexactly(5)
        (length,) = struct.unpack("!I", header[1:])
        return header[:1], await self.reader.readexactly(length - 4)

    async def until_ready(self) -> list[tuple[bytes, bytes]]:
        got = []
        while True:
            kind, body = await self.read()
            if kind == b"E":
                raise RuntimeError(body.decode(errors="replace"))
            got.append((kind, body))
            if kind == b"Z":
                return got

    async def prepare(self, statements: list[tuple[str, str]]) -> None:
        self.writer.write(b"".join(
            message(b"P", name.encode() + b"\0" + sql.encode() + b"\0\0\0")
            for name, sql in statements) + message(b"S"))
        got = await self.until_ready()
        assert [k for k, _ in got].count(b"1") == len(statements), got[:3]

    async def query(self, sql: str) -> list[list[str]]:
        self.writer.write(message(b"Q", sql.encode() + b"\0"))
        rows = []
        for kind, body in await self.until_ready():
            if kind == b"D":
                (count,) = struct.unpack_from("!H", body, 0)
                pos, row = 2, []
                for _ in range(count):
                    (size,) = struct.unpack_from("!i", body, pos)
                    pos += 4
                    row.append("" if size < 0 else body[pos : pos + size].decode())
                    pos += max(size, 0)
                rows.append(row)
            elif kind == b"T":
                (count,) = struct.unpack_from("!H", body, 0)
                pos, names = 2, []
                for _ in range(count):
                    end = body.index(b"\0", pos)
                    names.append(body[pos:end].decode())
                    pos = end + 19
                rows.append(names)
        return rows

    async def close(self) -> None:
        self.writer.write(message(b"X"))
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


async def column_total(admin: Client, command: str, column: str) -> int:
    rows = await admin.query(command)
    header, data = rows[0], rows[1:]
    index = header.index(column)
    return sum(int(row[index] or 0) for row in data)


async def measure(port: int, pid: int, clients: int, statements: int) -> dict[str, float]:
    gate = asyncio.Semaphore(100)
    before = rss_kib(pid)

    async def open_one() -> Client:
        async with gate:
            return await Client.connect(port, "app", "app")

    conns = await asyncio.gather(*(open_one() for _ in range(clients)))
    await asyncio.sleep(1.0)
    idle = rss_kib(pid)
    print(f"pooler RSS before clients: {before / 1024:.1f} MiB; "
          f"with {clients} idle clients: {idle / 1024:.1f} MiB", flush=True)
    started = time.monotonic()

    async def prepare(i: int, conn: Client) -> None:
        async with gate:
            await conn.prepare([(f"stmt_{j}", f"SELECT {j} AS j, {i} AS client /* c{i} */")
                                for j in range(statements)])

    await asyncio.gather(*(prepare(i, c) for i, c in enumerate(conns)))
    seconds = time.monotonic() - started
    await asyncio.sleep(1.0)
    prepared = rss_kib(pid)
    admin = await Client.connect(port, "pool_admin", "pgbouncer")
    client_total = await column_total(admin, "SHOW CLIENTS", "prepared_statements")
    server_total = await column_total(admin, "SHOW SERVERS", "prepared_statements")
    growth = prepared - idle
    print(f"after {clients} x {statements} Parses ({seconds:.1f} s): {prepared / 1024:.1f} MiB, "
          f"+{growth / 1024:.1f} MiB, {growth * 1024 / (clients * statements):.0f} bytes "
          f"per client statement; SHOW CLIENTS total {client_total}, SHOW SERVERS total "
          f"{server_total}", flush=True)
    for conn in conns:
        await conn.close()
    await asyncio.sleep(2.0)
    after = rss_kib(pid)
    client_left = await column_total(admin, "SHOW CLIENTS", "prepared_statements")
    print(f"after the clients left: {after / 1024:.1f} MiB "
          f"(SHOW CLIENTS total {client_left})", flush=True)
    await admin.close()
    return {
        "clients": clients, "statements_per_client": statements,
        "rss_mib_before_clients": round(before / 1024, 1),
        "rss_mib_idle_clients": round(idle / 1024, 1),
        "rss_mib_prepared": round(prepared / 1024, 1),
        "rss_growth_mib": round(growth / 1024, 1),
        "bytes_per_client_statement": round(growth * 1024 / (clients * statements)),
        "rss_mib_after_clients_left": round(after / 1024, 1),
        "client_statements_reported": client_total,
        "server_statements_reported": server_total,
        "prepare_seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--statements", type=int, default=200)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 2 * args.clients + 200))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    pg = EmbeddedPostgres()
    pg.start()
    work = Path(tempfile.mkdtemp(prefix="pypool-prepared-memory-"))
    proc = None
    try:
        pg.create_role("app", "app-secret")
        pg.create_role("pool_admin", "admin-secret", superuser=True)
        pg.execute("CREATE DATABASE app OWNER app")
        port = free_port()
        (work / "userlist.txt").write_text('"app" "app-secret"\n"pool_admin" "admin-secret"\n')
        (work / "pypool.ini").write_text(
            f"[databases]\napp = host={pg.host} port={pg.port} dbname=app\n\n[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\nauth_type = trust\n"
            f"auth_file = {work / 'userlist.txt'}\nadmin_users = pool_admin\n"
            "pool_mode = transaction\ndefault_pool_size = 20\n"
            f"max_client_conn = {args.clients + 100}\nmax_prepared_statements = 200\n"
            "log_connections = 0\nlog_disconnections = 0\n"
        )
        log = open(work / "pypool.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "pypool", str(work / "pypool.ini")], cwd=REPO,
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit((work / "pypool.log").read_text()) from None
                time.sleep(0.1)
        summary = asyncio.run(measure(port, proc.pid, args.clients, args.statements))
        print(json.dumps(summary))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        pg.stop()


if __name__ == "__main__":
    main()
