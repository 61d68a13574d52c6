"""A Pooler over fake sockets: the unit tests' stand-in for the network and PostgreSQL.

The Pooler and its ClientConnection and ServerConnection objects are the real ones; only
what touches the operating system is replaced:
- every transport is a `FakeTransport`, which records what is written to it and whether
  reading is paused, resumed or the transport closed;
- the clock (`Pooler.now`) is a `FakeClock` the test moves by hand;
- every connection the pooler opens goes through a fake `loop.create_connection`: a server
  the pool opens waits for its login until the test answers it (`open_servers`,
  `fail_logins`), as PostgreSQL would; a cancel's connection is kept in
  `FakePooler.cancels` until the test answers it (`answer_cancels`);
- the event loop exists (the Pooler asks for one) but runs only when the test calls
  `run_callbacks`: callbacks scheduled with call_soon (deferred writes,
  net/deferred_writes.py) and the pooler's tasks (connects, cancels) progress then.

Tests drive the connections as the network would: bytes to `data_received`, then read what
each transport received. They assert what a peer or an operator would see (bytes on the
wire, the connections' states, the pool's lists and counters, SQLSTATEs), not the flags the
link is kept in. After every step taken through these fakes (bytes delivered, a socket lost,
`run_callbacks`, the end of the test) each pool's idle stack is checked against its servers'
ServerState, and every server still open is checked to be in exactly one of its pool's
places (`assert_idle_in_step`; pooling/pool.py's `idle_out_of_step` and `listed_twice`),
and each server's count of the pooler's own queries in flight against their list
(core/replies.py `hiding`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from pypool.core.states import ServerState
from pypool.net.client import ClientConnection
from pypool.net.server import ServerConnection
from pypool.pooler import Pooler
from pypool.pooling.pool import Pool
from pypool.protocol import messages as m
from pypool.settings import DatabaseEntry, PoolerSettings, Settings, UserEntry

USER, PASSWORD, DATABASE = "app", "app-secret", "app"
# What a fresh PostgreSQL reports at login (a pool's server_params come from its first server).
SERVER_PARAMS = {"client_encoding": "UTF8", "DateStyle": "ISO, MDY", "TimeZone": "UTC",
                 "integer_datetimes": "on", "server_version": "17.0",
                 "standard_conforming_strings": "on"}


# The servers each FakePooler's pools opened, by id(its Pooler): `assert_idle_in_step`
# checks that each one still open is listed somewhere.
_DIALED: dict[int, list[tuple[ServerConnection, FakeTransport]]] = {}


def assert_idle_in_step(pooler: Any) -> None:
    """Every pool's `idle` stack and its servers' ServerState agree (pooling/pool.py says
    why both exist), no server is in two of a pool's places, and every server still open
    is in one of them: checked after every step a test takes through these fakes."""
    wrong = {pool.database: pool.idle_out_of_step() for pool in pooler.pools.values()}
    assert not any(wrong.values()), f"idle stack and ServerState disagree: {wrong}"
    twice = {pool.database: pool.listed_twice() for pool in pooler.pools.values()}
    assert not any(twice.values()), f"servers in two of a pool's places: {twice}"
    nowhere = [conn for conn, transport in _DIALED.get(id(pooler), ())
               if not transport.closed and conn.state is not ServerState.CLOSED
               and not conn.close_reason and conn not in conn.pool.servers()]
    assert not nowhere, f"open servers in none of their pool's places: {nowhere}"
    miscounted = [conn for conn, _ in _DIALED.get(id(pooler), ())
                  if conn.reader.hiding != len(conn.reader.backend.hidden)]
    assert not miscounted, f"hidden queries counted wrong: {miscounted}"


def split(data: bytes) -> list[tuple[str, bytes]]:
    """Backend or frontend messages (after the startup packet) as (type letter, body)."""
    out, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos + 1:pos + 5], "big")
        out.append((chr(data[pos]), bytes(data[pos + 5:pos + 1 + length])))
        pos += 1 + length
    assert pos == len(data), "a message cut short"
    return out


def kinds(data: bytes) -> str:
    """The type letters of the messages in `data`, in order ("CZ": CommandComplete,
    ReadyForQuery)."""
    return "".join(kind for kind, _ in split(data))


def errors_in(data: bytes) -> list[dict[str, str]]:
    """The fields (S, C, M, ...) of each ErrorResponse in `data`."""
    return [m.parse_error_fields(body) for kind, body in split(data) if kind == "E"]


def query_texts(data: bytes) -> list[str]:
    """The SQL of each simple Query in `data`."""
    return [m.parse_query_text(body) for kind, body in split(data) if kind == "Q"]


class FakeTransport:
    """An asyncio transport that records: bytes written, reading paused or not, closed."""

    def __init__(self, peername: tuple[str, int] | None = None) -> None:
        self.written = bytearray()
        self.writes = 0  # how many write calls (a syscall each, on a real socket)
        self.reading = True
        self.pauses = 0
        self.closed = False
        self.peername = peername
        self.protocol: Any = None  # set as its connection is made

    # --- what the pooler calls --------------------------------------------------------

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.written += data
        self.writes += 1

    def writelines(self, pieces: Any) -> None:
        for piece in pieces:
            self.write(piece)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peername if name == "peername" else default

    def get_protocol(self) -> Any:
        return self.protocol

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_write_buffer_size(self) -> int:
        return 0

    # --- what the test reads ----------------------------------------------------------

    def take(self) -> bytes:
        """Everything written since the last take."""
        data = bytes(self.written)
        self.written.clear()
        return data


class FakeClock:
    """`Pooler.now`: time stands still until the test moves it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.time = start

    def __call__(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        self.time += seconds


class Client:
    """A client connection and its socket, seen from the application's side."""

    def __init__(self, conn: ClientConnection, transport: FakeTransport) -> None:
        self.conn = conn
        self.transport = transport
        self.welcome = b""  # what the login sent, AuthenticationOk to ReadyForQuery
        self.cancel_key = (0, 0)  # from the welcome's BackendKeyData

    def send(self, *chunks: bytes) -> None:
        for chunk in chunks:
            self.conn.data_received(chunk)
            assert_idle_in_step(self.conn.pooler)

    def take(self) -> bytes:
        """What the client received since the last take (the welcome kept apart, once)."""
        data = self.transport.take()
        if not self.welcome and data[:1] == b"R" and m.ready_for_query() in data:
            welcome_end = data.index(m.ready_for_query()) + 6
            self.welcome, data = data[:welcome_end], data[welcome_end:]
            for kind, body in split(self.welcome):
                if kind == "K":
                    self.cancel_key = m.parse_backend_key_data(body)
        return data

    def leave(self) -> None:
        """The client's socket breaks (no Terminate)."""
        self.transport.closed = True
        self.conn.connection_lost(ConnectionResetError())
        assert_idle_in_step(self.conn.pooler)

    @property
    def state(self) -> Any:
        return self.conn.state


class Server:
    """A server connection and its socket, seen from PostgreSQL's side."""

    def __init__(self, conn: ServerConnection, transport: FakeTransport,
                 backend_key: tuple[int, int] = (0, 0)) -> None:
        self.conn = conn
        self.transport = transport
        self.backend_key = backend_key  # the BackendKeyData it sent at login

    def send(self, *chunks: bytes) -> None:
        for chunk in chunks:
            self.conn.data_received(chunk)
            assert_idle_in_step(self.conn.pooler)

    def take(self) -> bytes:
        return self.transport.take()

    def lose(self) -> None:
        """The connection to PostgreSQL breaks (the backend died)."""
        self.transport.closed = True
        self.conn.connection_lost(ConnectionResetError())
        assert_idle_in_step(self.conn.pooler)

    def closed(self) -> bytes:
        """The pooler closed this server: what it wrote last (a Terminate, if anything);
        asyncio's connection_lost is delivered, as it would be once the socket is shut."""
        assert self.transport.closed, "the pooler has not closed it"
        last = self.take()
        self.conn.connection_lost(None)
        assert_idle_in_step(self.conn.pooler)
        return last

    @property
    def state(self) -> Any:
        return self.conn.state


class CancelConnection:
    """A connection the pooler opened to PostgreSQL to send a CancelRequest."""

    def __init__(self, host: str, port: int, protocol: Any, transport: FakeTransport) -> None:
        self.host = host
        self.port = port
        self.protocol = protocol
        self.transport = transport
        self.answered = False

    @property
    def request(self) -> bytes:
        """What the pooler sent on it."""
        return bytes(self.transport.written)


class FakePooler:
    """A real Pooler whose sockets, clock and tasks are fakes (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.loop = asyncio.new_event_loop()
        # Every connection the pooler opens (a server's, in server_logins._connect; a
        # cancel's, through asyncio.open_connection) is made by this loop's
        # create_connection: a fake one here. Nothing on the Pooler itself is patched, so
        # this runs the same against the compiled modules.
        self.loop.create_connection = self._create_connection  # type: ignore[method-assign]
        self._dialed: list[tuple[ServerConnection, FakeTransport]] = []
        self._answered: set[ServerConnection] = set()  # logins answered (or refused)
        self.cancels: list[CancelConnection] = []
        self.refuse_cancels = False  # PostgreSQL's port refuses cancel connections
        self.pooler = self.loop.run_until_complete(self._make(settings))
        _DIALED[id(self.pooler)] = self._dialed
        self.clock = FakeClock()
        self.pooler.now = self.clock
        self._peer_port = 40000

    async def _create_connection(self, factory: Any, host: str, port: int,
                                 **_: Any) -> tuple[FakeTransport, Any]:
        protocol = factory()
        if not isinstance(protocol, ServerConnection) and self.refuse_cancels:
            raise ConnectionRefusedError(f"connect to {host}:{port} refused")
        transport = FakeTransport()
        if isinstance(protocol, ServerConnection):
            self._dialed.append((protocol, transport))
        else:
            self.cancels.append(CancelConnection(host, port, protocol, transport))
        transport.protocol = protocol
        protocol.connection_made(transport)
        return transport, protocol

    @staticmethod
    async def _make(settings: Settings) -> Pooler:
        return Pooler(settings)  # it asks for the running loop

    def close(self) -> None:
        _DIALED.pop(id(self.pooler), None)
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    # --- the pieces ---------------------------------------------------------------------

    def pool(self, database: str = DATABASE, user: str = USER) -> Pool:
        return self.pooler.pools[(database, user)]

    def run_callbacks(self) -> None:
        """Run what the pooler scheduled (call_soon, its connect tasks) until it waits."""
        for _ in range(3):
            self.loop.run_until_complete(asyncio.sleep(0))
        assert_idle_in_step(self.pooler)

    def connect(self, user: str = USER, database: str = DATABASE, **params: str) -> Client:
        """A client that connects and sends its StartupMessage. Welcomed at once when its
        pool knows its server parameters, else once a server has logged in; its socket is
        emptied of the welcome when that has come."""
        self._peer_port += 1
        transport = FakeTransport(("10.0.0.7", self._peer_port))
        conn = ClientConnection(self.pooler)
        transport.protocol = conn
        conn.connection_made(transport)
        conn.data_received(m.startup_message({"user": user, "database": database, **params}))
        client = Client(conn, transport)
        if m.ready_for_query() in transport.written:
            client.take()  # the welcome came: kept apart
        return client

    def cancel(self, key: tuple[int, int]) -> FakeTransport:
        """A connection that sends a CancelRequest with `key` (what the pooler closes); the
        pooler's tasks then run until they wait (the cancel's connection to PostgreSQL)."""
        self._peer_port += 1
        transport = FakeTransport(("10.0.0.7", self._peer_port))
        conn = ClientConnection(self.pooler)
        transport.protocol = conn
        conn.connection_made(transport)
        conn.data_received(m.cancel_request(*key))
        self.run_callbacks()
        return transport

    def answer_cancels(self) -> None:
        """PostgreSQL signals the backends and closes every cancel connection open."""
        for cancel in self.cancels:
            if not cancel.answered:
                cancel.answered = True
                cancel.protocol.connection_lost(None)
        self.run_callbacks()

    def opening(self) -> list[ServerConnection]:
        """Servers the pools have opened whose login PostgreSQL has not answered yet."""
        self.run_callbacks()
        return [conn for conn, _ in self._dialed
                if conn not in self._answered and conn.state is not ServerState.CLOSED]

    def open_servers(self, **params: str) -> list[Server]:
        """Log in every server the pools are opening, as PostgreSQL would: trust, its
        parameters (SERVER_PARAMS, overridden by `params`), a BackendKeyData, 'I'."""
        out = [self.log_in(conn, **params) for conn in self.opening()]
        self.run_callbacks()  # their connect tasks see the login done
        return out

    def fail_logins(self, error: bytes) -> list[Server]:
        """PostgreSQL refuses the login of every server the pools are opening with `error`
        (an ErrorResponse)."""
        out = []
        for conn in self.opening():
            self._answered.add(conn)
            server = self._server(conn)
            server.take()
            server.send(error)
            out.append(server)
        self.run_callbacks()  # their connect tasks see the login failed
        return out

    def _server(self, conn: ServerConnection) -> Server:
        (transport,) = [t for c, t in self._dialed if c is conn]
        return Server(conn, transport)

    def log_in(self, conn: ServerConnection, **params: str) -> Server:
        self._answered.add(conn)
        server = self._server(conn)
        assert server.take()[4:8] == b"\x00\x03\x00\x00", "a StartupMessage first"
        reported = {**SERVER_PARAMS, **params}
        key = server.backend_key = (4000 + conn.id, 777 + conn.id)
        server.send(b"".join(
            [m.authentication(m.AUTH_OK)]
            + [m.parameter_status(name, value) for name, value in reported.items()]
            + [m.backend_key_data(*key), m.ready_for_query()]))
        return server

    def client_with_server(self, **params: str) -> tuple[Client, Server]:
        """A client welcomed into a pool whose only server has logged in and sits idle."""
        client = self.connect(**params)
        (server,) = self.open_servers()
        assert client.take() == b"" and client.welcome, "welcomed, nothing more"
        assert server.state is ServerState.IDLE
        return client, server


def make_settings(databases: dict[str, DatabaseEntry] | None = None,
                  users: dict[str, UserEntry] | None = None, **keys: Any) -> Settings:
    """Settings as the ini would give them: transaction mode, trust, no TLS to servers, no
    server_check_query, pool_size 1 unless `keys` say otherwise."""
    base: dict[str, Any] = {"pool_mode": "transaction", "auth_type": "trust",
                            "default_pool_size": 1, "server_tls_sslmode": "disable",
                            "server_check_query": "", "log_connections": False,
                            "log_disconnections": False}
    base.update(keys)
    return Settings(pooler=PoolerSettings(**base),
                    databases=databases or {DATABASE: DatabaseEntry(name=DATABASE)},
                    users=users or {}, inline_users={USER: PASSWORD, "other": PASSWORD})


@pytest.fixture
def fake_pooler() -> Iterator[Any]:
    """`fake_pooler(databases=..., users=..., **keys)`: a FakePooler with those [pgbouncer]
    keys (transaction mode, trust, pool_size 1 unless said), closed after the test.
    Re-exported by the conftest.py of tests/net and tests/pooler."""
    made: list[FakePooler] = []

    def make(databases: dict[str, DatabaseEntry] | None = None,
             users: dict[str, UserEntry] | None = None, **keys: Any) -> FakePooler:
        fake = FakePooler(make_settings(databases, users, **keys))
        made.append(fake)
        return fake

    yield make
    for fake in made:
        assert_idle_in_step(fake.pooler)
        fake.close()


# --- what PostgreSQL sends -------------------------------------------------------------


def select_one(status: int = m.TX_IDLE) -> bytes:
    """The replies to `SELECT 1` as one simple Query: a row, its tag, ReadyForQuery."""
    return (m.row_description([("x", 23)]) + m.data_row(["1"]) + m.command_complete("SELECT 1")
            + m.ready_for_query(status))


def command(tag: str, status: int = m.TX_IDLE) -> bytes:
    """A command's tag and the ReadyForQuery after it."""
    return m.command_complete(tag) + m.ready_for_query(status)


def server_error(text: str, sqlstate: str, status: int = m.TX_IDLE) -> bytes:
    return m.error_response(text, sqlstate) + m.ready_for_query(status)
