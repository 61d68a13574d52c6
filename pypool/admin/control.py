"""What the console may change: the pooler's switches, as a Protocol the pooler satisfies.

The console's commands (commands.py) pause, resume, kill, reconnect, disable, reload, set and
shut down through the pooler's own methods, never by reaching into its connections. This is
the whole of that surface; everything else the console shows comes through the read-only
view (observe/view.py). The network layer's Pooler is one of these by shape, so admin/ needs
no import of net/: the start-up composition (cli.py) hands the pooler over.
"""

from __future__ import annotations

from collections.abc import Collection, MutableSet
from typing import Any, Protocol

from ..observe.view import ClientSide, PoolerState
from ..pooling.pool import Pool
from ..protocol.errors import PoolerError
from ..settings import Settings


class ControlledClient(ClientSide, Protocol):
    """A client the console can drop (KILL, KILL_CLIENT)."""

    def fail(self, exc: PoolerError) -> None: ...


class PoolerControl(PoolerState, Protocol):
    """The running pooler, as the console's commands drive it."""

    @property
    def clients(self) -> Collection[ControlledClient]: ...
    @property
    def paused_dbs(self) -> MutableSet[str]: ...
    @property
    def disabled_dbs(self) -> MutableSet[str]: ...
    @property
    def shutting_down(self) -> str: ...
    suspended: bool
    console_queries: int

    def pause_all(self, paused: bool) -> None: ...
    def set_paused(self, pool: Pool, paused: bool) -> None: ...
    def tag_dirty(self, pool: Pool, reason: str) -> None: ...
    def close_server(self, server: Any, reason: str) -> None: ...
    def reload(self) -> bool: ...
    def apply_settings(self, new: Settings) -> None: ...
    @property
    def tls_failure(self) -> str | None: ...
    def shutdown(self, how: str) -> None: ...
    def trace_client(self, target: str, on: bool) -> int: ...
