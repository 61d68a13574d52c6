"""The protocol trace of the running pooler: who is traced, switched at start, on reload and
from the console.

`trace = on` (or `pypool --trace`) traces every connection; the console's
`TRACE <client id|application_name> on|off` traces some clients while running. The trace
itself (observe/trace.py) is made through the `open_trace` hook cli.py sets. A connection
holds it in its `trace` attribute only while traced: a client when the filter wants it, a
server while a traced client is linked to it (or always, with `trace = on`), so that off,
the hot path asks one attribute per read or write and nothing more.

Nothing here runs per transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import research

if TYPE_CHECKING:
    from ..net.records import ClientRecord, WireTrace
    from ..settings import PoolerSettings
    from .record import PoolerRecord as Pooler


def _made(pooler: Pooler) -> WireTrace | None:
    if pooler.wire_trace is None and pooler.open_trace is not None:
        pooler.wire_trace = pooler.open_trace()
    return pooler.wire_trace


def apply(pooler: Pooler, old: PoolerSettings | None) -> None:
    """At start (old None) and after a reload or a SET: `trace = on|off`."""
    on = pooler.settings.pooler.trace
    if (old is not None and old.trace == on) or (pooler.wire_trace is None and not on):
        return
    trace = _made(pooler)
    if trace is None:
        return
    trace.filter.everyone = on
    pooler.trace_all = trace if on else None
    _refresh(pooler)


def switch(pooler: Pooler, target: str, on: bool) -> int:
    """The console's TRACE: trace one client (by id) or those of an application_name, or stop.
    Returns how many connected clients are traced now."""
    trace = _made(pooler)
    if trace is None:
        return 0
    wanted = trace.filter
    if target.isdigit():
        (wanted.ids.add if on else wanted.ids.discard)(int(target))
    else:
        (wanted.application_names.add if on else wanted.application_names.discard)(target)
    _refresh(pooler)
    return sum(1 for client in pooler.clients if client.trace is not None)


def named(pooler: Pooler, client: ClientRecord) -> None:
    """The client's startup packet is in: its application_name may be one traced."""
    trace = pooler.wire_trace
    if trace is not None and client.trace is None and trace.filter.wants(client):
        client.trace = trace


def _refresh(pooler: Pooler) -> None:
    trace = pooler.wire_trace
    for client in pooler.clients:
        client.trace = trace if trace is not None and trace.filter.wants(client) else None
    for server in research._servers(pooler):
        linked = server.client
        server.trace = (linked.trace if linked is not None and linked.trace is not None
                        else pooler.trace_all)
