"""What the start-up composition plugs into the network layer.

The admin console and the metrics endpoint sit above net/: they read the pooler through a
read-only view (observe/) and drive it through its own methods. So that net/ never imports
them, the pooler reaches them only through two hooks that cli.py's `build_pooler` sets once
at start-up, and a console client holds its session as a `ConsoleSession`. A pooler built
without them (a unit test) has no console and no metrics endpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .client import ClientConnection


class ConsoleSession(Protocol):
    """A client's admin console session: takes every byte the client sends after login."""

    def received(self, data: bytes) -> None: ...


# After a client authenticated to `pgbouncer`/`pypool`: admit it to the console (setting its
# `admin` session and welcoming it) or raise PoolerError.
OpenConsole = Callable[["ClientConnection"], None]
# At start, with metrics_port set: listen on (addresses, port), return the listeners.
ServeMetrics = Callable[[str, int], Awaitable[list[asyncio.AbstractServer]]]
