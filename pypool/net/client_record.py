"""What the pooler knows about one client: the fields of a client connection.

PgBouncer keeps a connection's fields in one struct (objects.h) and what is done with them in
client.c; here ClientRecord is that struct, and net/client.py the Protocol that acts. Every
other module reads and writes these fields by name; each is said here once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.frontend import RequestReader
from ..core.link import Link
from ..core.socket_ids import socket_ids as _ids  # shared with the other side
from ..core.states import ClientState
from ..pooling.session_state import ClientSession
from ..protocol import messages as m
from .flow_control import ReadingSwitch

if TYPE_CHECKING:
    from ..pooling import prepared
    from ..pooling import session_state as ss
    from ..pooling.pool import Pool
    from .hooks import ConsoleSession, TransactionLog, WireTrace
    from .port import PoolerPort
    from .server import ServerConnection


# The flow-control switch is a base of the record, not of the Protocol beside it: compiled,
# a class has at most one compiled base, and the Protocol's other base is asyncio's.
class ClientRecord(ReadingSwitch):
    """One client's identity, link, clocks and per-transaction bookkeeping."""

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
        # and ACTIVE, and the server it holds (or whose line it is in), set with it.
        self.link = Link()
        self.server: ServerConnection | None = None
        self.admin: ConsoleSession | None = None  # set when connected to the console
        # Tracked session parameters as this client should see them.
        self.params: dict[str, str] = {}
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
        # What it sent while it had no server (net/outbox.py), its size, and the driver
        # segment in it with the end of its Bind (see relay's fast path).
        self.outbox: list[bytes] = []
        self.outbox_size = 0
        self.outbox_segment: tuple[bytes, int] = (b"", 0)
        # Prepared-statement rewriting (None when off: session mode, max_prepared_statements
        # = 0, the admin console).
        self.statements: prepared.ClientStatements | None = None
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
