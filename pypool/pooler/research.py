"""The research switches of the running pooler: the pools' policies and the transaction log.

`queue_policy` / `server_policy` (pooling/policies.py) become one policy object per pool,
made when the pool is made and remade on a reload that changes them. `transaction_log`
(observe/txlog.py, reached through the `open_txlog` hook cli.py sets) is opened at start,
reopened on every reload (SIGHUP: log rotation), closed when the key is emptied; the
connections hold it (or None) so the hot path asks one attribute, never the settings.

Nothing here runs per transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..pooling import policies
from ..pooling.policies import Factories

if TYPE_CHECKING:
    from ..net.records import ServerRecord
    from ..pooling.pool import Pool
    from ..settings import PoolerSettings
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool")

def factories(cfg: PoolerSettings) -> Factories:
    """What makes each pool's queue and server policy (None: the inline default)."""
    return (policies.queue_factory(cfg.queue_policy, cfg.queue_priority),
            policies.server_factory(server_policy(cfg)))


def server_policy(cfg: PoolerSettings) -> str:
    """`server_policy`, or PgBouncer's `server_round_robin = 1` (idle servers used in turn,
    the one idle longest first) when server_policy is left at its lifo default."""
    if cfg.server_round_robin and cfg.server_policy == "lifo":
        return "fifo"
    return cfg.server_policy


def new_policies(pooler: Pooler) -> tuple[Any, Any]:
    """A new pool's queue and server policy objects."""
    make_queue, make_server = pooler.policy_factories
    return (None if make_queue is None else make_queue(),
            None if make_server is None else make_server())


def apply(pooler: Pooler, old: PoolerSettings | None) -> None:
    """At start (old None) and after a reload: policies and the transaction log."""
    cfg = pooler.settings.pooler
    if old is not None and (old.queue_policy, old.queue_priority, server_policy(old)) != (
            cfg.queue_policy, cfg.queue_priority, server_policy(cfg)):
        try:
            pooler.policy_factories = factories(cfg)
        except ValueError as exc:  # a module:Class that went away since it was checked
            log.error("queue_policy/server_policy: %s; keeping the old policies", exc)
        else:
            for pool in pooler.pools.values():
                set_policies(pool, new_policies(pooler))
            log.info("queue_policy %s, server_policy %s", cfg.queue_policy, server_policy(cfg))
    _apply_txlog(pooler, old)


def set_policies(pool: Pool, made: tuple[Any, Any]) -> None:
    pool.queue_policy, pool.server_policy = made


def _apply_txlog(pooler: Pooler, old: PoolerSettings | None) -> None:
    cfg = pooler.settings.pooler
    txlog = pooler.txlog
    path = cfg.transaction_log
    if txlog is not None and old is not None and path == old.transaction_log:
        txlog.reopen()  # SIGHUP: the file may have been rotated away
    elif txlog is not None:
        txlog.close()
        _attach(pooler, None)
        txlog = None
    if txlog is None and path and pooler.open_txlog is not None:
        txlog = pooler.open_txlog(path)
        _attach(pooler, txlog)
        log.info("transaction_log: writing to %s", path)
    if txlog is not None:
        txlog.queue_policy = cfg.queue_policy
        txlog.server_policy = cfg.server_policy


def _attach(pooler: Pooler, txlog: Any) -> None:
    """Give every connection the log (or None): they call it without asking the pooler."""
    pooler.txlog = txlog
    for client in pooler.clients:
        client.txlog = txlog
    for server in _servers(pooler):
        server.txlog = None if txlog is None else txlog.tap(server)


def _servers(pooler: Pooler) -> Iterator[ServerRecord]:
    for pool in pooler.pools.values():
        yield from pool.idle
        yield from pool.active
        yield from pool.login
        yield from pool.being_canceled


def close(pooler: Pooler) -> None:
    """At exit: the lines queued are written."""
    if pooler.txlog is not None:
        pooler.txlog.close()
        _attach(pooler, None)
