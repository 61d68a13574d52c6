"""What the start-up composition plugs into the network layer.

The admin console and the metrics endpoint sit above net/: they read the pooler through a
read-only view (observe/) and drive it through its own methods. So that net/ never imports
them, the pooler reaches them only through two hooks that cli.py's `build_pooler` sets once
at start-up, and a console client holds its session as a `ConsoleSession`. A pooler built
without them (a unit test) has no console and no metrics endpoint. The transaction log
(observe/txlog.py) and the protocol trace (observe/trace.py) are plugged in the same way
(`OpenTransactionLog`, `OpenTrace`). What the connections call on them (ConsoleSession,
TransactionLog, WireTrace) is said in net/records.py, beside the connections' records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .records import ClientRecord, TransactionLog, WireTrace


# After a client authenticated to `pgbouncer`/`pypool`: admit it to the console (setting its
# `admin` session and welcoming it) or raise PoolerError.
OpenConsole = Callable[["ClientRecord"], None]
# At start, with metrics_port set: listen on (addresses, port), return the listeners.
ServeMetrics = Callable[[str, int], Awaitable[list[asyncio.AbstractServer]]]


# With transaction_log set (at start or on reload): open the log at that path.
OpenTransactionLog = Callable[[str], "TransactionLog"]


# At start: make the protocol trace (cli.py: its lines go to the `pypool.trace` logger).
OpenTrace = Callable[[], "WireTrace"]
