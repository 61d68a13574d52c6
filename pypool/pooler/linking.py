"""Linking: which client gets which server, and when a server comes back.

A client that needs a server (`request_server`) is linked to an idle one (`link`), queued
on a busy server's pipeline line (net/pipeline.py), or queued in its pool while a server is
opened. A link first passes server_check_query and the SET of the client's session
parameters when either is needed (`parameters_applied`, `check_failed`,
`parameters_failed`). When the client's transaction ends with nothing owed, `release`
unlinks it, and `server_available` hands the server to the first waiting client, keeps it
idle, or closes it when it is due to close.

This is the hot path between the two Protocols: every transaction passes through `link`
and `release`. It owns no state of its own: the pools (pooling/pool.py) and the
connections hold it, and the Pooler (objects.py) calls in here and keeps the methods the
Protocols call. It moves the link (core/link.py) and carries out its actions; the link's
two ends and the hold on the client's requests it sets through net/link_ends.py, the one
writer of those fields. A server's ServerState and its place in the pool's lists move
together here (`take_idle` then LINKED; FREED then `put_idle`; a server handed from one
client straight to the next stays ACTIVE: pooling/pool.py says why both are kept).

Never hand a server on with replies owed, never give a server mid-transaction to another
client, and never hand out a server whose cancel may still land (server_available parks it
in Pool.being_canceled until cancel.py brings it back).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final, cast

from ..core import link as lk
from ..core.link import LinkEvent
from ..core.states import ClientState, IllegalTransition, ServerEvent, ServerState
from ..net import hidden_queries, link_ends, outbox, pipeline
from ..pooling.session_state import sync_statements
from ..pooling.stats import WAIT_BUCKETS, XACT_BUCKETS, observe
from ..protocol import errors
from ..protocol.errors import PoolerError
from . import replication, takeover

if TYPE_CHECKING:
    from ..net.records import ClientRecord, ServerRecord
    from ..pooling.pool import Pool
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool")

# How many servers in a row may fail server_check_query for one client before it is told.
CHECK_ATTEMPTS: Final = 3


def request_server(pooler: Pooler, client: ClientRecord, now: float = 0.0) -> None:
    """The client has sent something that needs a server (`now`: the clock, when the
    caller has just read it)."""
    pool = client.pool
    assert pool is not None
    if pooler.shutting_down == "SIGINT":  # no new transaction once the shutdown began
        client.fail(errors.shutting_down())
        return
    if not pool.paused:
        server = pool.take_idle()
        if server is not None:
            link(pooler, client, server, now)
            return
        if (pooler.pipeline_depth and pool.open_lines
                and pool.server_count >= pool.limits.pool_size
                and pipeline.join_open_line(pooler, client)):
            return
    failing = pooler.login_failing(pool)
    if failing is not None:
        if pooler.txlog is not None:
            pooler.txlog.refused(client, failing.sqlstate)
        client.fail(failing)
        return
    client.on_link(LinkEvent.QUEUED, now)
    client.wait_start = client.state_since
    client.wait_notified = False
    pool.enqueue(client)
    limits = pool.limits
    if pool.below(limits.pool_size + limits.reserve_pool_size):
        pooler.launch_servers(pool)  # else there is no room for another server anyway


def link(pooler: Pooler, client: ClientRecord, server: ServerRecord,
         now: float = 0.0) -> None:
    pool = server.pool
    now = now or pooler.now()
    # server_check_query: a server free for server_check_delay is checked before use.
    # As PgBouncer, only a server that has served before (sv_used) is checked.
    check = pooler.check_query
    if check and (not server.used or now - server.request_time < pooler.check_delay):
        check = ""
    if client.state is ClientState.WAITING:
        pool.stats.wait_time_us += int((now - client.wait_start) * 1e6)
        if pooler.histograms:
            observe(WAIT_BUCKETS, pool.stats.wait_counts, now - client.wait_start)
    if server.state is not ServerState.ACTIVE:
        server.on(ServerEvent.LINKED)  # taken from `idle`
    elif server.client is not None:
        # Handed on by server_available, ACTIVE from one client to the next: never while
        # another client holds it.
        raise IllegalTransition(f"{server!r}: linked to {client!r} while it serves another")
    link_ends.link(client, server)
    client.link_time = now
    server.request_time = now
    server.used = True
    pool.stats.server_assignment_count += 1
    if client.writing_paused or server.writing_paused:
        carry_back_pressure(client, server)
    # The settings that follow their clients (pooling/session_state.py): the last client's
    # undone and this one's made, only where they differ.
    session = client.session
    held = server.session_sets
    if session is None and held:
        session = client.session_record()  # another client's settings to undo for it
    sync = b""
    if session is not None and (session.sets or held):
        sync = sync_statements(held or {}, session.sets)
        if sync:
            pool.stats.session_synced += 1
            server.session_sets = session.on_server() or None
    setting = bool(check or sync) or not server.reader.covers(client.params)
    actions = client.on_link(LinkEvent.LINKED_TO_SET if setting else LinkEvent.LINKED, now)
    if actions & lk.HOLD:
        # What the client sent waits for the check's and the SET's replies
        # (parameters_applied, check_failed, parameters_failed).
        link_ends.hold(client)
        hidden_queries.prepare_for(server, client, check, sync)
        return
    if session is not None and session.pending:
        server.session_sets = session.on_server() or None
    if actions & lk.SEND:
        _send_outbox(pooler, client, server)


def parameters_applied(pooler: Pooler, server: ServerRecord,
                       client: ClientRecord) -> None:
    """The check and SET sent at link time succeeded: the client's requests go now."""
    actions = client.on_link(LinkEvent.APPLIED)
    link_ends.unhold(client)
    client.check_failures = 0
    if actions & lk.SEND:
        _send_outbox(pooler, client, server)
    if not client.reader.blocked:
        outbox.carry_on(client)  # what it sent meanwhile


def check_failed(pooler: Pooler, server: ServerRecord, client: ClientRecord | None,
                 why: str) -> None:
    """server_check_query failed or the server died under it: the server goes, and the
    client (none of whose requests were sent) asks for another."""
    log.warning("%r: server_check_query failed: %s", server, why)
    server.pool.stats.count_error("server_check_failed")
    if client is not None and server.client is client:
        actions = client.on_link(LinkEvent.CHECK_FAILED)
        if actions & lk.UNLINK:
            link_ends.unlink(client, server)
            link_ends.unhold(client)
        if actions & lk.CLOSE_SERVER:
            server.close(f"server_check_query failed: {why}")
        if not actions & lk.ASK_AGAIN:
            return
        client.check_failures += 1
        if client.check_failures >= CHECK_ATTEMPTS:
            # Every server fails it: say so rather than open servers without end.
            client.fail(PoolerError(f"server_check_query failed: {why}"))
            return
        asked = client.link_time
        request_server(pooler, client)
        if client.state is ClientState.WAITING:
            # Still the same wait: query_wait_timeout counts from the first ask.
            client.wait_start = min(client.wait_start, asked)
    else:
        server.close(f"server_check_query failed: {why}")


def parameters_failed(pooler: Pooler, server: ServerRecord, client: ClientRecord,
                      fields: dict[str, str]) -> None:
    """The SET sent at link time failed: none of the client's requests ran; they would
    have run under settings it did not ask for. As PgBouncer, the client is dropped with
    the reason, and the server is closed."""
    text = fields.get("M", "")
    log.warning("%r: could not set the client's session parameters on %r: %s", client,
                server, text)
    client.fail(PoolerError(f"could not set session parameters on the server: {text}",
                            fields.get("C") or errors.PROTOCOL_VIOLATION))
    server.close("session parameters could not be set")


def _send_outbox(pooler: Pooler, client: ClientRecord, server: ServerRecord) -> None:
    data = outbox.take_outbox(client, server)
    if data:
        if pipeline.worth_extending(server):
            # Sends data, then the waiting clients' behind it, or lists the server as
            # one whose line has room.
            pipeline.extend(pooler, server, data)
        else:
            server.send(data)
    outbox.answer_own(client, server)


def release(pooler: Pooler, client: ClientRecord, now: float = 0.0,
            then_close: bool = False) -> None:
    """The client's transaction ended and nothing is owed (its link said RELEASE,
    core/link.py): its server goes back. `then_close`: the link said CLOSE_CLIENT too (a
    shutdown that waited for this transaction's end)."""
    server = client.server
    assert server is not None and client.pool is not None
    now = now or pooler.now()
    stats = client.pool.stats
    stats.xact_count += 1
    held = now - client.link_time
    stats.xact_time_us += int(held * 1e6)
    if pooler.histograms:
        observe(XACT_BUCKETS, stats.xact_counts, held)
    if pooler.txlog is not None:
        pooler.txlog.released(client, server, now)
    link_ends.unlink(client, server)
    if client.guard is not None:
        client.guard = None  # its line is over (net/pipeline.py)
    if server._reading_paused:
        server.resume_reading()
    if client.state is ClientState.CLOSED:  # it left while queued in a pipeline
        _hand_back(pooler, server, now)
        return
    if client._reading_paused:
        client.resume_reading()
    _hand_back(pooler, server, now)
    if then_close:
        client.fail(errors.shutting_down())
    elif client.reader.blocked:
        outbox.resume_rewriting(client)  # what it sent meanwhile goes to its next server
    elif pooler.passing_clients:
        takeover.catch(client)  # an online restart: passed on from its boundary


def _hand_back(pooler: Pooler, server: ServerRecord, now: float) -> None:
    """A server whose client is done: to the next client of its line, or back to the pool
    (after the reset query if server_reset_query_always), unless prepared-statement replies
    are still owed, which the next client would get: then it closes."""
    if server.chain:
        pipeline.hand_on(pooler, server, now)
    elif server.statements.detach():
        _reset_always(pooler, server)
        server_available(pooler, server, now)
    else:
        log.error("%r: prepared-statement requests still queued at release", server)
        server.close("prepared-statement replies out of step")


def _reset_always(pooler: Pooler, server: ServerRecord) -> None:
    """server_reset_query_always: the reset query after every transaction, in every
    pool mode (its replies are hidden; the next client's requests queue behind it)."""
    if pooler.reset_query_always:
        hidden_queries.send_hidden_query(server, pooler.reset_query_always)


def server_available(pooler: Pooler, server: ServerRecord, now: float = 0.0) -> None:
    """A server with no client: hand it to the first waiting client, or keep it idle
    (`now`: the clock, when the caller has just read it)."""
    pool = server.pool
    if server.cancels_in_flight:
        pool.park_canceled(server)  # _send_cancel brings it back (Pool.unpark)
        return
    now = now or pooler.now()
    # server_lifetime = 0: each server serves once (PgBouncer's meaning).
    lifetime = server.pool.limits.server_lifetime
    if pool.paused or server.close_needed or pool.removed or (
        now - server.connect_time > lifetime
        and server.state is not ServerState.LOGIN
    ):
        reason = _close_reason(pooler, server, now)
        if reason:
            server.close(reason)
            return
    if server.state is ServerState.LOGIN:
        server.on(ServerEvent.FREED)  # logged in: free for the first time
    server.request_time = now  # free since now (server_check_delay counts from here)
    if pool.replication_waiting and replication.claim_freed(pooler, pool, server):
        return  # closed to make room for a replication client that came first
    if not pool.paused:
        # Typed, so that its state is read as a field, not looked up by name (the pool
        # holds its clients as Any).
        while (client := cast("ClientRecord | None", pool.dequeue())) is not None:
            if client.state is ClientState.WAITING:
                # A server that served stays ACTIVE from one client to the next: FREED and
                # LINKED would only cross IDLE and back, two rows of the table a
                # transaction (bench/README.md).
                link(pooler, client, server, now)
                return
    if server.state is not ServerState.IDLE:
        server.on(ServerEvent.FREED)
    pool.put_idle(server)


def _close_reason(pooler: Pooler, server: ServerRecord, now: float) -> str:
    """Why a server that just became free must close instead of serving again, if so."""
    pool = server.pool
    if pool.paused:
        return "pause mode"
    if server.close_needed:
        return "database configuration changed"
    if pool.removed and not pool.clients:
        return "database removed"
    lifetime = server.pool.limits.server_lifetime
    if now - server.connect_time > lifetime and (
        server.state is not ServerState.LOGIN
    ):
        return "server lifetime over"
    return ""


def serve_waiting(pooler: Pooler, pool: Pool) -> None:
    while pool.waiting and pool.idle and not pool.paused:
        server = pool.take_idle()
        client = pool.dequeue()
        assert server is not None and client is not None
        if client.state is ClientState.WAITING:
            link(pooler, client, server)
        else:
            pool.put_idle(server)


def carry_back_pressure(client: ClientRecord, server: ServerRecord) -> None:
    """A new link inherits the pauses its two sides are in: a client still above its write
    high-water mark gets a server whose reading is paused, and the other way round."""
    if client.writing_paused:
        server.pause_reading()
    if server.writing_paused:
        client.pause_reading()
