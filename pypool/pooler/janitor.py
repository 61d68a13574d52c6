"""The janitor: what the pooler does on a timer rather than on a message.

Every JANITOR_PERIOD, `sweep` enforces the timeouts (client_login_timeout,
query_wait_timeout and query_wait_notify, query_timeout, idle_transaction_timeout,
transaction_timeout, client_idle_timeout), lets go the clients that left while they were
not read (back-pressure hides their close: net/flow_control.departed), closes servers past
server_idle_timeout or
server_lifetime down to min_pool_size, opens the servers the pools want, and forgets the
pools of removed databases once their last client has left. Every stats_period,
`run_stats_period` snapshots the counters for SHOW STATS and logs the "stats:" line.

It owns no state: it reads the clocks kept on the connections and the pools. It must never
close an idle server but through close_server, which takes it off the idle stack before
anyone can be handed it; and one failed sweep must not stop the next.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from ..core.states import ClientState
from ..net import pipeline
from ..net.flow_control import departed
from ..pooling.stats import stats_line
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError

if TYPE_CHECKING:
    from ..net.records import ClientRecord
    from ..pooling.pool import Pool
    from ..settings import UserEntry
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool")

JANITOR_PERIOD: Final = 0.5
# PgBouncer's text for query_wait_notify.
WAIT_NOTICE: Final = "No server connection available in postgres backend, client being queued"


async def run_janitor(pooler: Pooler) -> None:
    """The janitor's task, started with the pooler: a sweep every JANITOR_PERIOD."""
    while True:
        await asyncio.sleep(JANITOR_PERIOD)
        try:
            sweep(pooler)
        except Exception:  # noqa: BLE001 - the janitor must outlive any one bug
            log.exception("janitor failed")


def sweep(pooler: Pooler) -> None:
    """Enforce the timeouts and keep the pools at their sizes."""
    cfg = pooler.settings.pooler
    now = pooler.now()
    for client in departed([*pooler.login_clients, *pooler.clients]):
        client.close("client closed the connection")
    if cfg.client_login_timeout:
        for client in list(pooler.login_clients):
            if now - client.connect_time > cfg.client_login_timeout:
                client.fail(PoolerError("client_login_timeout"))
    for pool in list(pooler.pools.values()):
        if pooler.shutting_down == "SIGINT":  # queued clients will not be served now
            for client in list(pool.waiting) + list(pool.awaiting_params):
                if client.state is ClientState.WAITING or client in pool.awaiting_params:
                    client.fail(errors.shutting_down())
        user_entry = pooler.settings.users.get(pool.user)
        # [users] timeouts win over [pgbouncer]'s, 0 too (it turns one off for that user).
        query_timeout = _user_value(user_entry, "query_timeout", cfg.query_timeout)
        _expire_waiting(pooler, pool, now, query_timeout)
        _expire_active(pool, now, query_timeout,
                       _user_value(user_entry, "idle_transaction_timeout",
                                   cfg.idle_transaction_timeout),
                       _user_value(user_entry, "transaction_timeout", cfg.transaction_timeout))
        _close_idle_servers(pooler, pool, now)
        if pool.removed and not pool.clients:
            _drop_removed(pooler, pool)
            continue
        if cfg.pool_idle_timeout and _forget_if_unused(pooler, pool, now, cfg.pool_idle_timeout):
            continue
        pooler.launch_servers(pool)
    _expire_idle_clients(pooler, now)


def _expire_waiting(pooler: Pooler, pool: Pool, now: float, query_timeout: float) -> None:
    """The clients of `pool` that wait for a server: query_timeout, query_wait_timeout,
    client_login_timeout at login, and query_wait_notify's NOTICE."""
    cfg = pooler.settings.pooler
    if query_timeout:
        # As PgBouncer: a query's time counts while it waits for a server too
        # ("query_timeout", its text for a client refused before it ran).
        while pool.waiting and now - pool.waiting[0].wait_start > query_timeout:
            pool.stats.count_error("query_timeout")
            pool.waiting[0].fail(PoolerError("query_timeout"))
    wait_timeout = pool.limits.query_wait_timeout
    if wait_timeout:
        while pool.waiting and now - pool.waiting[0].wait_start > wait_timeout:
            pool.stats.count_error("query_wait_timeout")
            pool.waiting[0].fail(PoolerError("query_wait_timeout"))
        # Clients queued on a busy server's line whose turn has not come, past their
        # deadline (net/pipeline.py: their guards keep the refusal true).
        for server in [s for s in pool.active if s.chain]:
            pipeline.refuse_overdue(pooler, server, now)
    # Clients at login waiting for the pool's first server wait for a server too; and,
    # as PgBouncer, their login is bounded by client_login_timeout (a server that cannot
    # be reached leaves them waiting for retries otherwise, with the timeouts above 0).
    for client in list(pool.awaiting_params):
        waited = now - client.state_since
        if query_timeout and waited > query_timeout:
            expired, text = "query_timeout", "query_timeout"
        elif wait_timeout and waited > wait_timeout:
            expired, text = "query_wait_timeout", "query_wait_timeout"
        elif cfg.client_login_timeout and now - client.connect_time > cfg.client_login_timeout:
            expired, text = "client_login_timeout", "client_login_timeout (server down)"
        else:
            continue
        pool.stats.count_error(expired)
        client.fail(PoolerError(text))
    if cfg.query_wait_notify:
        # PgBouncer 1.25: tell a client queued this long why its query has not run.
        for client in pool.waiting:
            if now - client.wait_start <= cfg.query_wait_notify:
                break  # the queue is in arrival order
            if not client.wait_notified and client.state is ClientState.WAITING:
                client.wait_notified = True
                client.write(m.notice_response(WAIT_NOTICE))


def _expire_active(pool: Pool, now: float, query_timeout: float, idle_xact_timeout: float,
                   xact_timeout: float) -> None:
    """The clients linked to a server of `pool`: query_timeout, idle_transaction_timeout
    and transaction_timeout, each closing the server with its client."""
    for server in list(pool.active):
        # Its own name and type: compiled, a name keeps the type of its first use, and an
        # active server may have no client.
        linked: ClientRecord | None = server.client
        if linked is None:
            continue
        client = linked
        # Replies owed, or a message half-sent whose rest has not come: a query in flight.
        if not client.reader.done_with_server():
            if query_timeout and now - client.query_start > query_timeout:
                server.close("query timeout")
                pool.stats.count_error("query_timeout")
                client.fail(PoolerError("query timeout"))
        elif (
            idle_xact_timeout
            and client.tx_status != m.TX_IDLE
            and now - client.state_since > idle_xact_timeout
        ):
            server.close("idle transaction timeout")
            pool.stats.count_error("idle_transaction_timeout")
            client.fail(PoolerError("idle transaction timeout"))
        if client.state is ClientState.CLOSED:
            continue
        if xact_timeout and now - client.xact_start > xact_timeout and (
            not client.ledger.idle() or client.tx_status != m.TX_IDLE
        ):
            server.close("transaction timeout")
            pool.stats.count_error("transaction_timeout")
            client.fail(PoolerError("transaction timeout"))


def _close_idle_servers(pooler: Pooler, pool: Pool, now: float) -> None:
    """The idle servers of `pool` past server_idle_timeout or server_lifetime, closed down
    to min_pool_size."""
    cfg = pooler.settings.pooler
    keep = pool.limits.min_pool_size
    for server in list(pool.idle):
        if len(pool.idle) + len(pool.active) <= keep:
            break
        idle_for = now - server.request_time
        if (cfg.server_idle_timeout and idle_for > cfg.server_idle_timeout) or (
            pool.limits.server_lifetime
            and now - server.connect_time > pool.limits.server_lifetime
        ):
            # Through the one close path: out of the idle stack at once, so it is
            # never handed out while closing, and the count above sees it gone.
            pooler.close_server(server, "server idle timeout"
                              if idle_for > cfg.server_idle_timeout
                              else "server lifetime over")


def _expire_idle_clients(pooler: Pooler, now: float) -> None:
    """client_idle_timeout ([users], else [pgbouncer]): idle clients are closed."""
    cfg = pooler.settings.pooler
    users = pooler.settings.users
    if cfg.client_idle_timeout or any(u.client_idle_timeout for u in users.values()):
        for client in list(pooler.clients):
            idle_timeout = _user_value(users.get(client.user), "client_idle_timeout",
                                       cfg.client_idle_timeout)
            if idle_timeout and client.state is ClientState.IDLE and (
                now - client.state_since > idle_timeout
            ):
                if client.pool is not None:
                    client.pool.stats.count_error("client_idle_timeout")
                client.fail(PoolerError("client_idle_timeout"))


def _user_value(entry: UserEntry | None, key: str, default: float) -> float:
    """A [users] timeout if that user sets it, else the [pgbouncer] one."""
    value = getattr(entry, key) if entry is not None else None
    return default if value is None else float(value)


def _forget_if_unused(pooler: Pooler, pool: Pool, now: float, timeout: float) -> bool:
    """pool_idle_timeout (PgBouncer 1.26): a pool with no client and no server for that
    long since a sweep last found it in use is forgotten; the next client of its database
    and user makes it anew. As PgBouncer, a pool of a database with a forced user and a
    min_pool_size is kept: the janitor opens its servers without any client."""
    if not pool.unused():
        pool.last_used = now
        return False
    if not pool.last_used:
        pool.last_used = now
    if now - pool.last_used <= timeout or (
            pool.limits.min_pool_size and _forced_user(pooler, pool)):
        return False
    del pooler.pools[(pool.database, pool.user)]
    # PgBouncer's words.
    log.info("cleaning up idle pool for user %s on db %s because: pool idle timeout "
             "(age= %ds)", pool.user, pool.database, int(now - pool.last_used))
    return True


def _forced_user(pooler: Pooler, pool: Pool) -> bool:
    """Whether the pool's database entry names the user its servers log in as."""
    entry = pooler.settings.database(pool.database)  # the `*` entry for an auto database
    return entry is not None and bool(entry.user)


def _drop_removed(pooler: Pooler, pool: Pool) -> None:
    """A pool of a removed database whose last client left: close it down, forget it."""
    for server in list(pool.idle):
        pooler.close_server(server, "database removed")
    if pool.server_count == 0:
        del pooler.pools[(pool.database, pool.user)]
        if not any(p.database == pool.database for p in pooler.pools.values()):
            pooler.retired.pop(pool.database, None)


async def run_stats_period(pooler: Pooler) -> None:
    """Every stats_period: snapshot the counters (SHOW STATS averages) and log the
    "stats:" line, as PgBouncer does."""
    while True:
        await asyncio.sleep(max(0.1, pooler.settings.pooler.stats_period))
        averages = pooler.stats_periods.refresh(list(pooler.pools.values()), pooler.now())
        if pooler.settings.pooler.log_stats:
            log.info("%s", stats_line(averages))
