"""What the connections, their helpers and the pooler hold of one another.

A client's fields and a server's (ClientRecord, ServerRecord: PgBouncer keeps them in one
struct each, objects.h; net/client.py and net/server.py are the Protocols that act on them),
the pooler as they see it (PoolerPort), and the observers they feed (the console session,
the transaction log, the protocol trace). These name one another: a client holds its server
and the pooler, the pooler is handed clients and servers, a trace is fed them. So they are
said together, here, below everything else in net/: the connections subclass the records,
and the helpers beside them (outbox, pipeline, hidden queries, deferred writes, the logins,
the TLS handshakes), net/hooks.py and pooler/ take the records. Nothing below the two
connection classes imports them.

The calls the helpers and pooler/ make on a connection (`client.write`, `server.send`,
`client.close`, ...) are declared at the end of each record, their bodies raising
NotImplementedError; net/client.py's ClientConnection and net/server.py's
ServerConnection carry them out, and tests/net/test_records.py keeps the lists exactly those
calls. Compiled, they are direct calls through the class's method table, as on the
connections themselves. The same holds for the steps of a client's login others take
(ClientLoginSteps, carried out by net/client_login.py's ClientLogin).

PoolerPort: the client and server Protocols, their logins and the helpers call into the
running pooler at their turning points: a client connected, authenticated or closed; a
request needs a server; a ReadyForQuery went by; a server logged in or closed; a hidden query
settled. It lists those calls and the few fields they read (the settings, the clock, the loop,
the TLS contexts, the statement registry, the transaction log and trace in force), and nothing
else. pooler/objects.py's Pooler declares it among its bases, and mypy checks that it
implements it. So net/ never imports pooler/, not even to type a parameter; the unit tests
drive the connections with a real Pooler over fake sockets (tests/net/fakes.py).

Never here: work beyond the fields; a Protocol member with a default (a Protocol member of a
compiled module may not have one); a call that only the console or the start-up makes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from mypy_extensions import trait

from ..core import replies
from ..core.frontend import RequestReader
from ..core.link import Link
from ..core.socket_ids import socket_ids as _ids  # shared by both sides
from ..core.states import SERVER_ROWS, ClientState, ServerState
from ..pooling import prepared
from ..pooling.params import ClientParams
from ..pooling.session_state import ClientSession
from ..protocol import messages as m
from .flow_control import ReadingSwitch

if TYPE_CHECKING:
    from ..auth.server_credentials import ServerCredentials
    from ..pooling import session_state as ss
    from ..pooling.pipeline_guard import Guard
    from ..pooling.pool import Pool
    from ..pooling.prepared import Registry
    from ..protocol.errors import PoolerError
    from ..settings import Settings
    from .tls import ClientTls, Tls


# --- the pooler, as the connections see it -------------------------------------------------


@trait
class PoolerPort:
    """What net/ needs of the running pooler (pooler/objects.py's Pooler, which declares
    it among its bases). A mypyc trait rather than a Protocol: the connections call the
    pooler several times per transaction, and a call through a Protocol is a generic
    Python method call (~25 ns compiled), through a trait a table lookup (~2 ns)
    (bench/README.md). In Python it is an ordinary base class."""

    # --- read by the connections -------------------------------------------------------------
    settings: Settings
    loop: asyncio.AbstractEventLoop
    # The pooler's clock (time.monotonic): every state, wait and query time.
    now: Callable[[], float]
    pipeline_depth: int  # [pgbouncer] pipeline_depth, read per transaction
    histograms: bool  # the wait and transaction time histograms are kept (metrics_port)
    tls: Tls  # the TLS contexts in force
    statement_registry: Registry  # prepared statements by Parse body, shared by all pools
    txlog: TransactionLog | None  # the transaction log, None when off
    trace_all: WireTrace | None  # the protocol trace with `trace = on`, else None
    # Servers with writes deferred to the end of this round (net/deferred_writes.py).
    to_flush: list[ServerRecord]
    console_logins: int  # the console's client_login_count, counted at its welcome

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` as a task the pooler keeps until it is done."""

    # --- a client's life -----------------------------------------------------------------
    def client_connected(self, client: ClientRecord) -> None: ...

    def forward_cancel(self, pid: int, secret: int) -> None:
        """A CancelRequest with a pooler-issued key."""

    def begin_authentication(self, client: ClientRecord) -> None:
        """The startup packet is in: admit the client and find its secret."""

    def client_authenticated(self, client: ClientRecord, scram_key: bytes | None) -> None:
        ...

    def client_closed(self, client: ClientRecord, reason: str) -> None: ...

    # --- a transaction -------------------------------------------------------------------
    def request_server(self, client: ClientRecord, now: float = 0.0) -> None:
        """The client has sent something that needs a server (`now`: the clock, when the
        caller has just read it)."""

    def session_changed(self, client: ClientRecord) -> None:
        """The client sent statements that change session state."""

    def pipeline(self, server: ServerRecord) -> None:
        """The linked client has sent a whole transaction: queue waiting clients behind it."""

    def ready_for_query(self, client: ClientRecord, status: int) -> None:
        """The linked server forwarded a ReadyForQuery to `client`."""

    def message_sent(self, client: ClientRecord) -> None:
        """The rest of a message whose start was on the linked server has gone to it."""

    # --- the pooler's own queries on a server (net/hidden_queries.py) -----------------------
    def parameters_applied(self, server: ServerRecord, client: ClientRecord) -> None:
        ...

    def parameters_failed(self, server: ServerRecord, client: ClientRecord,
                          fields: dict[str, str]) -> None: ...

    def check_failed(self, server: ServerRecord, client: ClientRecord | None,
                     why: str) -> None: ...

    # --- a server's life -------------------------------------------------------------------
    def server_logged_in(self, server: ServerRecord) -> None: ...

    def server_closed(self, server: ServerRecord, reason: str) -> None: ...


# --- what the connections feed: the console, the transaction log, the protocol trace -------


class ConsoleSession(Protocol):
    """A client's admin console session: takes every byte the client sends after login."""

    def received(self, data: bytes) -> None: ...


class ServerTap(Protocol):
    """The transaction log's reader of one server's replies (observe/txlog.py)."""

    def feed(self, data: bytes) -> None: ...


class TransactionLog(Protocol):
    """The transaction log (observe/txlog.py), as the pooler feeds it. None when off."""

    queue_policy: str
    server_policy: str
    dropped: int
    written: int

    def client_data(self, client: ClientRecord, n: int) -> None: ...
    def tap(self, server: ServerRecord) -> ServerTap: ...
    def released(self, client: ClientRecord, server: ServerRecord,
                 now: float) -> None: ...
    def client_closed(self, client: ClientRecord, reason: str) -> None: ...
    def refused(self, client: ClientRecord, sqlstate: str) -> None: ...
    def reopen(self) -> None: ...
    def close(self) -> None: ...


class TraceFilter(Protocol):
    """Which clients the protocol trace follows (observe/trace.py's TraceFilter)."""

    everyone: bool
    ids: set[int]
    application_names: set[str]

    def wants(self, client: ClientRecord) -> bool: ...


class WireTrace(Protocol):
    """The protocol trace (observe/trace.py), fed at the four socket points. A connection
    holds it only while traced (None otherwise: one attribute check per read or write)."""

    @property
    def filter(self) -> TraceFilter: ...

    def client_read(self, client: ClientRecord, data: bytes) -> None: ...
    def client_write(self, client: ClientRecord, data: bytes) -> None: ...
    def client_gone(self, client: ClientRecord) -> None: ...
    def server_write(self, server: ServerRecord, data: bytes, own: bool = False) -> None: ...
    def server_read(self, server: ServerRecord, data: bytes) -> None: ...
    def server_done(self, server: ServerRecord) -> None: ...
    def server_gone(self, server: ServerRecord) -> None: ...


# --- a client -------------------------------------------------------------------------------


class ClientLoginSteps:
    """The steps of a client's login others take: the socket's events (net/client.py), the
    TLS handshake (net/tls_handshake.py), the pooler once it knows the secret
    (pooler/client_logins.py). Carried out by net/client_login.py's ClientLogin."""

    __slots__ = ("adopting",)  # held for every client logging in: no __dict__

    # Logged in by the process this one took over (-R, pooler/takeover.py): what sets it up
    # here, called once, at connection_made.
    adopting: Callable[[], None] | None

    def connected(self, transport: asyncio.BaseTransport) -> None:
        raise NotImplementedError

    def startup_data(self, data: bytes) -> None:
        raise NotImplementedError

    def start_auth(self, secret: str | None, auth_type: str) -> None:
        raise NotImplementedError

    def auth_data(self, data: bytes) -> None:
        raise NotImplementedError

    def tls_started(self, transport: asyncio.Transport, client_tls: ClientTls,
                    direct: bool = False) -> None:
        raise NotImplementedError

    def tls_failed(self, reason: str) -> None:
        raise NotImplementedError

    def welcome(self, server_params: dict[str, str], send: bool = True) -> None:
        raise NotImplementedError


# The flow-control switch is a base of the record, not of the Protocol beside it: compiled,
# a class has at most one compiled base, and the Protocol's other base is asyncio's.
class ClientRecord(ReadingSwitch):
    """One client's identity, link, clocks and per-transaction bookkeeping."""

    # Its login, to its ReadyForQuery (net/client_login.py); None after the welcome. Set by
    # ClientConnection; the TLS handshake and pooler/ (auth, takeover) call its steps.
    login: ClientLoginSteps | None

    def __init__(self, pooler: PoolerPort) -> None:
        self.id = next(_ids)
        self.pooler = pooler
        self.state = ClientState.STARTUP  # core/states.py says what each state means
        self.peer = ("", 0)  # ("unix", listen_port) on the unix socket, as PgBouncer shows it
        # On the unix socket: the peer process's uid (SO_PEERCRED), for `auth_type = peer` and
        # the console's `pgbouncer` login; None over TCP.
        self.peer_uid: int | None = None
        # Logged into the console as user `pgbouncer` by the pooler's own OS user over the
        # unix socket (PgBouncer's own_user): an admin without a password.
        self.own_user = False
        self.user = ""
        self.database = ""
        self.pool: Pool | None = None
        # Its link to a server (core/link.py): the state that moves it between IDLE, WAITING
        # and ACTIVE, and the server it holds (or whose line it is in), set with it; the
        # pointer is written only by net/link_ends.py.
        self.link = Link()
        self.server: ServerRecord | None = None
        self.admin: ConsoleSession | None = None  # set when connected to the console
        # Tracked session parameters as this client should see them (a dict that knows
        # when it changed: pooling/params.py).
        self.params = ClientParams()
        self.startup_params: dict[str, str] = {}
        self.cancel_key = (0, 0)
        now = pooler.now()
        self.connect_time = now
        self.state_since = now  # when the current state (IDLE, WAITING, ...) began
        self.wait_start = 0.0
        self.link_time = 0.0
        self.query_start = 0.0
        self.xact_start = 0.0  # when its current transaction began (transaction_timeout)
        self.wait_notified = False  # query_wait_notify's NOTICE sent for this wait
        self.check_failures = 0  # servers in a row that failed server_check_query for it
        self.tx_status = m.TX_IDLE
        # The transaction log (observe/txlog.py), fed each read; None with the log off.
        self.txlog: TransactionLog | None = pooler.txlog
        # The protocol trace (observe/trace.py) when this client is traced; else None.
        self.trace: WireTrace | None = pooler.trace_all
        # What the client sends after login: framed, counted by its ledger and rewritten
        # for prepared statements (core/frontend.py).
        self.reader = RequestReader(pooler.settings.pooler.max_packet_size)
        self.ledger = self.reader.ledger
        self.writing_paused = False  # our socket is above its high-water mark
        # What it sent while it had no server (net/outbox.py): the first piece, and a list
        # only when more follow (None while they do not: the common transaction, one read,
        # touches no list); its size, and the driver segment in it with the end of its Bind
        # (see relay's fast path).
        self.outbox = b""
        self.outbox_more: list[bytes] | None = None
        self.outbox_size = 0
        self.outbox_segment: tuple[bytes, int] = (b"", 0)
        # Prepared-statement rewriting (None when off: session mode, max_prepared_statements
        # = 0, the admin console).
        self.statements: prepared.ClientStatements | None = None
        # The query_wait_timeout guard of its transaction while it is queued on a busy
        # server's line (pooling/pipeline_guard.py, net/pipeline.py); None once that server
        # is released.
        self.guard: Guard | None = None
        # The session state that follows or pins it (transaction mode, session_state =
        # follow; pooling/session_state.py). Made when first needed (`session_record` below):
        # None until then, and always when it is not looked at. 10,000 idle
        # clients that never SET anything hold no record.
        self.session: ss.ClientSession | None = None
        # The reported parameters a record made for it leaves alone, when session_state =
        # follow applies to it; None when it does not (one shared frozenset).
        self.follows: frozenset[bytes] | None = None
        self.tls_info = ""  # TLS's line of SHOW CLIENTS ("" in plaintext)

    def session_record(self) -> ss.ClientSession | None:
        """The client's session-state record, made when first needed: at its first change,
        its first error, or a link to a server holding another client's settings (which
        must be undone for it). Until then one made at login would hold nothing and have
        seen no error. None when session_state = follow does not apply to it."""
        session = self.session
        if session is None and self.follows is not None:
            session = self.session = ClientSession(self.follows)
        return session

    def __repr__(self) -> str:
        return f"C-{self.id}:{self.database}/{self.user}@{self.peer[0]}:{self.peer[1]}"

    # --- the calls the helpers and pooler/ make on a client ------------------------------
    # Carried out by net/client.py's ClientConnection.

    def on(self, event: int, now: float = 0.0) -> None:
        raise NotImplementedError

    def on_link(self, event: int, now: float = 0.0) -> int:
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def data_received(self, data: bytes) -> None:
        raise NotImplementedError

    def fail(self, exc: PoolerError) -> None:
        raise NotImplementedError

    def close(self, reason: str) -> None:
        raise NotImplementedError

    def welcome(self, server_params: dict[str, str], send: bool = True) -> None:
        raise NotImplementedError

    def relay(self, data: bytes) -> None:
        raise NotImplementedError

    def forward(self, data: bytes, now: float = 0.0) -> None:
        raise NotImplementedError


# --- a server -------------------------------------------------------------------------------


# The flow-control switch is a base of the record, not of the Protocol beside it: compiled,
# a class has at most one compiled base, and the Protocol's other base is asyncio's.
class ServerRecord(ReadingSwitch):
    """One server's address, login, link, and the readers of its replies."""

    def __init__(
        self, pooler: PoolerPort, pool: Pool, host: str, port: int, dbname: str,
        credentials: ServerCredentials, startup_params: dict[str, str],
    ) -> None:
        self.id = next(_ids)
        self.pooler = pooler
        self.pool = pool
        self.host = host
        self.port = port
        self.dbname = dbname
        self.credentials = credentials
        self.startup_params = startup_params
        self.state = ServerState.CONNECTING  # core/states.py says what each state means
        self.state_row = SERVER_ROWS[ServerState.CONNECTING]  # moved with it (server.py `on`)
        # The client its replies go to (the head of its line); written only by
        # net/link_ends.py, with the reply reader's view of that client.
        self.client: ClientRecord | None = None
        self.backend_pid = 0
        self.backend_secret = 0
        # The protocol trace (observe/trace.py) while a traced client is linked (or all are).
        self.trace: WireTrace | None = pooler.trace_all
        now = pooler.now()
        self.connect_time = now
        self.request_time = now  # when last linked or released
        # Whether it has served a client (PgBouncer's sv_used): only such a server is given
        # server_check_query; one fresh from its login has just proved itself.
        self.used = False
        # CancelRequests aimed at this server's backend not yet known to have landed: while
        # any is, the server is handed to no one (Pool.being_canceled).
        self.cancels_in_flight = 0
        # Close it instead of reusing it, once free (RECONNECT, a changed [databases] entry:
        # pooler/lifecycle.py `tag_dirty`; PgBouncer's close_needed).
        self.close_needed = False
        # Clients whose transactions are queued on this server behind the linked client's,
        # in order (net/pipeline.py); their replies follow its ReadyForQuery. A tuple, replaced
        # when the line changes (it is at most pipeline_depth long): every release asks
        # whether it is empty, and the empty tuple is one object shared by all servers.
        self.chain: tuple[ClientRecord, ...] = ()
        self.open_line = False  # listed in its pool's open_lines
        # Prepared statements on this server and the requests its replies answer.
        self.statements = prepared.ServerStatements(
            pooler.statement_registry, pooler.settings.pooler.max_prepared_statements,
            pool.stats,
        )
        # Everything read after the login: framing, the backend ledger, the server's
        # session parameters (core/replies.py).
        self.reader = replies.ReplyReader(self.statements, pool.stats)
        self.backend = self.reader.backend
        self.params = self.reader.params
        # The settings clients made here that follow them (pooling/session_state.py): name ->
        # the statement that made it, None when unsure. Undone before anyone else runs here.
        # None while it holds none (every link asks; most servers never hold any): made by
        # pooler/transactions.py before a client's record writes into it.
        self.session_sets: dict[bytes, bytes | None] | None = None
        self.close_reason = ""
        self.local_port = 0
        self.ready: asyncio.Future[None] = pooler.loop.create_future()  # logged in
        self.tls_info = ""  # TLS's line of SHOW SERVERS ("" in plaintext)
        self.writing_paused = False  # our socket to PostgreSQL is above its high-water mark
        # Requests written together when this round of the event loop has read everything
        # that was ready (net/deferred_writes.py); None while there are none, as almost
        # always without pipelining: `send` then asks no list.
        self.deferred: list[bytes] | None = None
        self.reader.name = repr(self)

    # The transaction log's reader of this server's replies; None with the log off. Set by
    # ServerConnection.
    txlog: ServerTap | None

    def __repr__(self) -> str:
        return f"S-{self.id}:{self.pool.database}/{self.pool.user}@{self.host}:{self.port}"

    @property
    def hidden_syncs(self) -> int:
        """Pooler-issued queries still to be answered."""
        return self.reader.hiding

    @property
    def checking(self) -> bool:
        """server_check_query's reply is still to come."""
        return self.backend.checking

    # --- the calls the helpers and pooler/ make on a server ------------------------------
    # Carried out by net/server.py's ServerConnection.

    def on(self, event: int) -> None:
        raise NotImplementedError

    def close(self, reason: str) -> None:
        raise NotImplementedError

    def send(self, data: bytes, own: bool = False) -> None:
        raise NotImplementedError

    def data_received(self, data: bytes) -> None:
        raise NotImplementedError

    def at_message_boundary(self) -> bool:
        raise NotImplementedError
