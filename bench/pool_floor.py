"""The pooling floor: the least a transaction pooler in Python on uvloop can do, measured beside
pypool and PgBouncer (`bench/run --poolers pypool,pgbouncer,floor`).

bench/relay.py is the floor for moving bytes, but it keeps one PostgreSQL connection per
client, so PostgreSQL runs 100 or 200 backends under it instead of the pool's 20, and its TPS
says little about a pooler's. This one pools as pypool and PgBouncer do (default_pool_size
servers, logged in once at start; clients queue, first come first served, when all are
linked) and does nothing else:
- a client's login is answered at once (AuthenticationOk, a few ParameterStatus,
  BackendKeyData, ReadyForQuery): no password, no SCRAM;
- a client's bytes go to its server as they come; a client with no server takes an idle one
  or waits in line, its bytes kept until it has one;
- a server's bytes go to its client as they come, and when a read ends in ReadyForQuery 'I'
  the server goes back: to the first client in line, or to the idle list. Nothing is framed:
  only the last six bytes of a read are looked at.

So it is wrong wherever a real pooler must be right (a ReadyForQuery split across reads, a
client that dies mid-transaction, session state, prepared statements, errors): a bench
reference only, never a pooler. What pypool does beyond it costs CPU per transaction that this
does not, and PgBouncer's TPS over this one's says what any Python pooler on uvloop can reach
on this machine.

Run as a target: `python bench/pool_floor.py INI PASSWORD_FILE`, the ini the harness writes
for the poolers (listen_addr and listen_port, default_pool_size, the first [databases]
entry) and a file holding the role's password.

`POOL_FLOOR_TOUCH=N` (an environment variable; `bench/ab.py ... floor@POOL_FLOOR_TOUCH=N`)
gives every client and every server N objects of their own, of assorted sizes, and reads and
writes each of them on each of the connection's reads: what touching N more objects of a
connection per read costs a pooler whose objects are out of the caches between its reads
(bench/README.md, "At a fixed rate"). `POOL_FLOOR_SHARED=N` gives the pool N such objects,
touched on every read of every connection: what objects every transaction shares (a pool's
sets, its counters, the pooler's) cost, warmer than a connection's.
"""

from __future__ import annotations

import asyncio
import collections
import os
import struct
import sys

import pgwire
import relay
import uvloop

READY_IDLE = b"Z\x00\x00\x00\x05I"
TERMINATE = b"X\x00\x00\x00\x04"
SSL_REQUEST = 80877103
WELCOME = b"".join([
    b"R" + struct.pack("!ii", 8, 0),  # AuthenticationOk
    *(pgwire.message(b"S", f"{name}\0{value}\0".encode()) for name, value in (
        ("server_version", "15.0"), ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"), ("DateStyle", "ISO, MDY"),
        ("integer_datetimes", "on"), ("standard_conforming_strings", "on"))),
    b"K" + struct.pack("!iii", 12, 1, 1),  # BackendKeyData
    READY_IDLE,
])


TOUCH = int(os.environ.get("POOL_FLOOR_TOUCH", "0"))
SHARED = int(os.environ.get("POOL_FLOOR_SHARED", "0"))


# Objects of seven sizes (one to seven slots), so that a connection's own objects lie in
# different size classes of the allocator, apart from one another, as a pooler's do.
PARTS = [type(f"Part{k}", (), {"__slots__": tuple(f"s{i}" for i in range(k))})
         for k in range(1, 8)]


def parts(count: int = TOUCH) -> list[object]:
    own = []
    for n in range(count):
        part = PARTS[n % len(PARTS)]()
        part.s0 = 0  # type: ignore[attr-defined]
        own.append(part)
    return own


def touch(own: list[object]) -> None:
    for part in own:
        part.s0 += 1  # type: ignore[attr-defined]


class Pool:
    def __init__(self) -> None:
        self.idle: list[Server] = []
        self.waiting: collections.deque[Client] = collections.deque()
        self.own: list[object] = parts(SHARED)


class Server(asyncio.Protocol):
    def __init__(self, pool: Pool, login: object = None) -> None:
        self.pool = pool
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.client: Client | None = None
        self.login = login  # its pgwire.Connection, kept: it closes the socket when collected
        self.own: list[object] = parts()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None:
            return
        if TOUCH:
            touch(self.own)
        if SHARED:
            touch(self.pool.own)
        if client.alive:
            client.transport.write(data)
        if data.endswith(READY_IDLE):
            client.server = None
            pool = self.pool
            while pool.waiting:
                nxt = pool.waiting.popleft()
                if nxt.alive:
                    self.client, nxt.server = nxt, self
                    self.transport.write(b"".join(nxt.pending))
                    nxt.pending.clear()
                    return
            self.client = None
            pool.idle.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        print("a server connection closed", exc, file=sys.stderr)


class Client(asyncio.Protocol):
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: Server | None = None
        self.pending: list[bytes] = []
        self.started = False
        self.alive = True
        self.own: list[object] = parts()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        server = self.server
        if TOUCH:
            touch(self.own)
        if SHARED:
            touch(self.pool.own)
        if data == TERMINATE:
            self.transport.close()  # never to a server: it stays in the pool
        elif server is not None:
            server.transport.write(data)
        elif not self.started:
            if struct.unpack("!i", data[4:8])[0] == SSL_REQUEST:
                self.transport.write(b"N")
            else:
                self.started = True
                self.transport.write(WELCOME)
        else:
            self.pending.append(data)
            if len(self.pending) > 1:
                return  # already in line
            pool = self.pool
            if pool.idle:
                server = pool.idle.pop()
                self.server, server.client = server, self
                server.transport.write(data)
                self.pending.clear()
            else:
                pool.waiting.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False  # a server it holds stays linked to it until its ReadyForQuery 'I'


async def serve(ini: str, password_file: str) -> None:
    section, listen, fields = relay.read_ini(ini)
    user, password = open(password_file).read().split()
    pool = Pool()
    for _ in range(int(section.get("default_pool_size", "20"))):
        login = await pgwire.connect(fields["host"], int(fields["port"]), user.strip('"'),
                                     password.strip('"'), fields["dbname"])
        server = Server(pool, login)
        server.connection_made(login.hand_over(server))
        pool.idle.append(server)
    listener = await asyncio.get_running_loop().create_server(
        lambda: Client(pool), *listen, backlog=4096)
    async with listener:
        await listener.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(sys.argv[1], sys.argv[2]))
