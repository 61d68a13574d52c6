"""The per-server LRU: which of the pooler's Statements a server has prepared, under their
`PYPOOL_<n>` names, bounded by max_prepared_statements.

`ServerCache` owns `lru` (Statement -> the link it was last used in), `stale` (statements
the server may or may not still have, after something ran there that the pooler could not
follow: `distrust`), and the references the server holds in the Registry. It decides what to
send first so the server has a statement (`_ensure`: nothing, or an injected Parse, after
Closes of least recently used statements to make room), and applies or undoes the
protocol-level requests when they settle. The LRU never closes a statement used in the
current link: a portal made from it may still be open.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

from .request_queue import RequestQueue
from .requests import (
    OP_CLOSE,
    OP_DISTRUST,
    OP_EVICT,
    OP_INJECT,
    OP_NAMED,
    OP_PARSE,
    OP_PARSE_HIT,
    OP_STALE,
    R_NAME,
    R_OP,
    R_STMT,
    R_WAIT,
    W_CLOSE,
    W_PARSE,
    Request,
    close_statement,
)

if TYPE_CHECKING:
    from ..pool import PoolStats
    from .registry import Registry, Statement

log = logging.getLogger("pypool.prepared")


class ServerCache(RequestQueue):
    """The statements one server has prepared, as far as the pooler knows."""

    def __init__(self, registry: Registry, cap: int, stats: PoolStats | None = None) -> None:
        super().__init__(registry, stats)
        self.cap = cap  # max_prepared_statements
        self.lru: OrderedDict[Statement, int] = OrderedDict()  # -> epoch of last use
        # Statements the server may or may not still have, since something ran there that
        # the pooler could not follow (`distrust`): closed first when parsed there again.
        self.stale: set[Statement] = set()
        self.epoch = 0  # bumped at each link: statements used in this link are not evicted

    def _ensure(self, stmt: Statement) -> bytes:
        """What to send first so the server has `stmt` (b"" if it has it already)."""
        lru = self.lru
        if stmt in lru:
            lru.move_to_end(stmt)
            lru[stmt] = self.epoch
            if self.stats is not None:
                self.stats.prepared_hits += 1
            return b""
        return self._inject(stmt)

    def _admit(self, stmt: Statement) -> bytes:
        """A statement this server lacks is to be parsed here: count the miss, make room
        under the cap, drop a stale copy, and list it. Returns what must go first."""
        stats = self.stats
        if stats is not None:
            stats.prepared_misses += 1
            stats.server_parse_count += 1
        out = self._make_room()
        if self.stale and stmt in self.stale:
            out += self._close_stale(stmt)
        self.registry.hold(stmt)
        self.lru[stmt] = self.epoch
        return out

    def _inject(self, stmt: Statement) -> bytes:
        out = self._admit(stmt)
        self._push((W_PARSE, True, OP_INJECT, stmt, None, self.segment, None))
        return out + stmt.parse_message()

    def _close_stale(self, stmt: Statement) -> bytes:
        """The server may still have `stmt` (see `stale`): close it before parsing it again,
        so that the Parse cannot fail with 42P05."""
        self.stale.discard(stmt)
        self._push((W_CLOSE, True, OP_STALE, stmt, None, self.segment, None))
        return close_statement(stmt.name)

    def distrust(self, why: str) -> None:
        """Something ran on the server that the pooler could not follow and that may have
        dropped prepared statements (a DO block running DEALLOCATE ALL, a function, a
        DEALLOCATE in a multi-statement query), or a Bind found one missing (26000). The
        cache cannot be trusted: forget it. Each statement is parsed again where it is next
        used, closed first in case it survived (`stale`)."""
        log.debug("server's prepared statements forgotten: %s", why)
        lru = self.lru
        stale = self.stale
        if stale:  # keep it to statements still in use, which may be parsed here again
            for stmt in [s for s in stale if s.refs <= 0]:
                stale.discard(stmt)
        if lru:
            release = self.registry.release
            for stmt in lru:
                stale.add(stmt)
                release(stmt)
            lru.clear()

    def _make_room(self) -> bytes:
        """Close least recently used statements until one more fits."""
        lru = self.lru
        out = b""
        while len(lru) >= self.cap > 0:
            stmt, used = next(iter(lru.items()))
            if used == self.epoch:
                break  # all used by this link's transaction: exceed the cap until the next
            del lru[stmt]
            if self.stats is not None:
                self.stats.prepared_evictions += 1
            # The queue entry owns the LRU's reference until the CloseComplete arrives.
            self._push((W_CLOSE, True, OP_EVICT, stmt, None, self.segment, None))
            out += close_statement(stmt.name)
        return out

    def _settled(self, request: Request, ok: bool) -> None:
        op = request[R_OP]
        stmt = request[R_STMT]
        name = request[R_NAME]
        if op == OP_PARSE or op == OP_INJECT or op == OP_PARSE_HIT:
            assert stmt is not None
            if ok:
                if op != OP_PARSE_HIT and stmt not in self.lru:
                    # Forgotten meanwhile (an earlier Parse of it failed): it exists now.
                    self.registry.hold(stmt)
                    self.lru[stmt] = self.epoch
                return
            if op != OP_PARSE_HIT:
                self._forget_server(stmt)
            if name is not None:
                self._forget_client(name, stmt)
        elif op == OP_EVICT:
            assert stmt is not None
            if ok or stmt in self.lru:
                self.registry.release(stmt)
            else:
                self.lru[stmt] = 0
                self.lru.move_to_end(stmt, last=False)
        elif op == OP_CLOSE:
            assert stmt is not None and name is not None
            client = self.client
            if ok or client is None or name in client.names:
                self.registry.release(stmt)
            else:
                client.names[name] = stmt
        elif op == OP_DISTRUST:
            if ok:
                self.distrust("a query that may deallocate ran")
        elif op == OP_STALE:
            if not ok:
                assert stmt is not None
                self.stale.add(stmt)  # skipped: the server may still have it
        elif op == OP_NAMED:
            if ok and request[R_WAIT] == W_PARSE and stmt is not None:
                # A duplicate Parse, sent under the name of a statement the server should
                # have, succeeded: the server had lost it, and now has another text under
                # its name. Close that before it is parsed here again.
                self.distrust("a duplicate Parse found it missing")
                self.stale.add(stmt)

    def _forget_server(self, stmt: Statement) -> None:
        if stmt in self.lru:
            del self.lru[stmt]
            self.registry.release(stmt)

    def _forget_client(self, name: bytes, stmt: Statement) -> None:
        client = self.client
        if client is not None and client.names.get(name) is stmt:
            del client.names[name]
            self.registry.release(stmt)

    def clear(self) -> None:
        """The server dropped every prepared statement (DEALLOCATE ALL, DISCARD ALL): so did
        the linked client. Parses still queued behind it will exist again."""
        release = self.registry.release
        for stmt in self.lru:
            release(stmt)
        self.lru.clear()
        self.stale.clear()
        client = self.client
        if client is not None:
            for stmt in client.names.values():
                release(stmt)
            client.names.clear()
        for request in self.queue:
            op, queued, name = request[R_OP], request[R_STMT], request[R_NAME]
            if queued is None or op not in (OP_PARSE, OP_PARSE_HIT, OP_INJECT):
                continue
            if op != OP_PARSE_HIT and queued not in self.lru:
                self.registry.hold(queued)
                self.lru[queued] = self.epoch
            if client is not None and name is not None and name not in client.names:
                self.registry.hold(queued)
                client.names[name] = queued

    def close(self) -> None:
        """The server is gone: give back every reference it held."""
        release = self.registry.release
        for stmt in self.lru:
            release(stmt)
        self.lru.clear()
        for request in self.queue:
            if request[R_OP] in (OP_EVICT, OP_CLOSE) and request[R_STMT] is not None:
                release(request[R_STMT])
        self.queue.clear()
        self.readies_queued = self.readies_done = 0
        self.tracking = 0
        self.stale.clear()
