"""The pooler as the network layer sees it: exactly what net/ reads and calls on it.

The client and server Protocols, their logins and the helpers beside them (outbox,
pipeline, hidden queries, deferred writes) call into the running pooler at their turning
points: a client connected, authenticated or closed; a request needs a server; a
ReadyForQuery went by; a server logged in or closed; a hidden query settled. `PoolerPort`
lists those calls and the few fields they read (the settings, the clock, the loop, the TLS
contexts, the statement registry, the transaction log and trace in force), and nothing else.

pooler/objects.py's Pooler implements it structurally: mypy checks that it does wherever a
Pooler is passed as a `PoolerPort`. So net/ never imports pooler/, not even to type a
parameter, and a unit test drives a connection with a small fake in its place.

Never here: anything with a default (a Protocol member of a compiled module may not have
one), or a call that only the console or the start-up makes.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from ..pooling.prepared import Registry
    from ..settings import Settings
    from .client import ClientConnection
    from .hooks import TransactionLog, WireTrace
    from .server import ServerConnection
    from .tls import Tls


class PoolerPort(Protocol):
    """What net/ needs of the running pooler (pooler/objects.py's Pooler)."""

    # --- read by the connections -------------------------------------------------------------
    settings: Settings
    loop: asyncio.AbstractEventLoop
    # The pooler's clock (time.monotonic): every state, wait and query time.
    now: Callable[[], float]
    pipeline_depth: int  # [pgbouncer] pipeline_depth, read per transaction
    tls: Tls  # the TLS contexts in force
    statement_registry: Registry  # prepared statements by Parse body, shared by all pools
    txlog: TransactionLog | None  # the transaction log, None when off
    trace_all: WireTrace | None  # the protocol trace with `trace = on`, else None
    # Servers with writes deferred to the end of this round (net/deferred_writes.py).
    to_flush: list[ServerConnection]
    console_logins: int  # the console's client_login_count, counted at its welcome

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` as a task the pooler keeps until it is done."""

    # --- a client's life -----------------------------------------------------------------
    def client_connected(self, client: ClientConnection) -> None: ...

    def forward_cancel(self, pid: int, secret: int) -> None:
        """A CancelRequest with a pooler-issued key."""

    def begin_authentication(self, client: ClientConnection) -> None:
        """The startup packet is in: admit the client and find its secret."""

    def client_authenticated(self, client: ClientConnection, scram_key: bytes | None) -> None:
        ...

    def client_closed(self, client: ClientConnection, reason: str) -> None: ...

    # --- a transaction -------------------------------------------------------------------
    def request_server(self, client: ClientConnection) -> None:
        """The client has sent something that needs a server."""

    def session_changed(self, client: ClientConnection) -> None:
        """The client sent statements that change session state."""

    def pipeline(self, server: ServerConnection) -> None:
        """The linked client has sent a whole transaction: queue waiting clients behind it."""

    def ready_for_query(self, client: ClientConnection, status: int) -> None:
        """The linked server forwarded a ReadyForQuery to `client`."""

    # --- the pooler's own queries on a server (net/hidden_queries.py) -----------------------
    def parameters_applied(self, server: ServerConnection, client: ClientConnection) -> None:
        ...

    def parameters_failed(self, server: ServerConnection, client: ClientConnection,
                          fields: dict[str, str]) -> None: ...

    def check_failed(self, server: ServerConnection, client: ClientConnection | None,
                     why: str) -> None: ...

    # --- a server's life -------------------------------------------------------------------
    def server_logged_in(self, server: ServerConnection) -> None: ...

    def server_closed(self, server: ServerConnection, reason: str) -> None: ...
