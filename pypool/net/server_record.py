"""What the pooler knows about one server connection: its fields.

As PgBouncer keeps a connection's fields in one struct (objects.h) and what is done with
them in server.c, ServerRecord is that struct and net/server.py the Protocol that acts.
Every other module reads and writes these fields by name; each is said here once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from ..core import replies
from ..core.socket_ids import socket_ids as _ids  # shared with the other side
from ..core.states import ServerState
from ..pooling import prepared
from .flow_control import ReadingSwitch

if TYPE_CHECKING:
    from ..auth.server_credentials import ServerCredentials
    from ..pooling.pool import Pool
    from .client import ClientConnection
    from .hooks import WireTrace
    from .port import PoolerPort


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
        self.client: ClientConnection | None = None
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
        # Clients whose transactions are queued on this server behind the linked client's,
        # in order (net/pipeline.py); their replies follow its ReadyForQuery.
        self.chain: deque[ClientConnection] = deque()
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
        self.session_sets: dict[bytes, bytes | None] = {}
        self.close_reason = ""
        self.local_port = 0
        self.ready: asyncio.Future[None] = pooler.loop.create_future()  # logged in
        self.tls_info = ""  # TLS's line of SHOW SERVERS ("" in plaintext)
        self.writing_paused = False  # our socket to PostgreSQL is above its high-water mark
        # Requests written together when this round of the event loop has read everything
        # that was ready (net/deferred_writes.py).
        self.deferred: list[bytes] = []
        self.reader.name = repr(self)

    def __repr__(self) -> str:
        return f"S-{self.id}:{self.pool.database}/{self.pool.user}@{self.host}:{self.port}"

    @property
    def hidden_syncs(self) -> int:
        """Pooler-issued queries still to be answered."""
        return len(self.backend.hidden)

    @property
    def checking(self) -> bool:
        """server_check_query's reply is still to come."""
        return self.backend.checking
