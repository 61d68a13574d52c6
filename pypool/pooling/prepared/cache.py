"""The per-server LRU: which of the pooler's Statements a server has prepared, under their
`PYPOOL_<n>` names, bounded by max_prepared_statements.

`ServerCache` owns `lru` (Statement -> the link it was last used in), `stale` (statements
the server may or may not still have, after something ran there that the pooler could not
follow: `forget`), and the references the server holds in the Registry. It decides what to
send first so the server has a statement (`ensure`: nothing, or an injected Parse, after
Closes of least recently used statements to make room), queuing those requests on the
server's RequestQueue, and applies or undoes the protocol-level requests when they settle
(`settled`). The LRU never closes a statement used in the current link: a portal made from
it may still be open. It never looks at a client message or a server reply.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .requests import Op, Request, Wait, close_statement

if TYPE_CHECKING:
    from ..pool import PoolStats
    from .registry import ClientStatements, Registry, Statement
    from .request_queue import RequestQueue

log = logging.getLogger("pypool.prepared")


class ServerCache:
    """The statements one server has prepared, as far as the pooler knows."""

    def __init__(self, registry: Registry, cap: int, requests: RequestQueue,
                 stats: PoolStats | None = None) -> None:
        self.registry = registry
        self.requests = requests  # where the Parses and Closes it decides on are queued
        self.stats = stats
        self.cap = cap  # max_prepared_statements
        self.lru: OrderedDict[Statement, int] = OrderedDict()  # -> epoch of last use
        # Statements the server may or may not still have, since something ran there that
        # the pooler could not follow (`forget`): closed first when parsed there again.
        self.stale: set[Statement] = set()

    @property
    def epoch(self) -> int:
        """The current link's number (its request queue counts the links): statements used
        in this link are not evicted. Kept there, so that a link that uses no named
        statement never looks at the cache."""
        return self.requests.links

    def ensure(self, stmt: Statement) -> bytes:
        """What to send first so the server has `stmt` (b"" if it has it already)."""
        lru = self.lru
        if stmt in lru:
            lru.move_to_end(stmt)
            lru[stmt] = self.epoch
            if self.stats is not None:
                self.stats.prepared_hits += 1
            return b""
        return self.inject(stmt)

    def admit(self, stmt: Statement) -> bytes:
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

    def inject(self, stmt: Statement) -> bytes:
        """The pooler's own Parse of `stmt` (its reply swallowed), after what must go first."""
        out = self.admit(stmt)
        self.requests.push(Request(Wait.PARSE, True, Op.INJECT, stmt, None,
                                   self.requests.segment))
        return out + stmt.parse_message()

    def _close_stale(self, stmt: Statement) -> bytes:
        """The server may still have `stmt` (see `stale`): close it before parsing it again,
        so that the Parse cannot fail with 42P05."""
        self.stale.discard(stmt)
        self.requests.push(Request(Wait.CLOSE, True, Op.STALE, stmt, None,
                                   self.requests.segment))
        return close_statement(stmt.name)

    def forget(self, why: str) -> None:
        """The server's part of ServerStatements.distrust: forget the cache. Each statement is
        parsed again where it is next used, closed first in case it survived (`stale`)."""
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
            self.requests.push(Request(Wait.CLOSE, True, Op.EVICT, stmt, None,
                                       self.requests.segment))
            out += close_statement(stmt.name)
        return out

    def settled(self, request: Request, ok: bool, client: ClientStatements | None) -> None:
        """A protocol-level request (Op.PARSE, PARSE_HIT, INJECT, EVICT, CLOSE, STALE)
        completed (ok) or was skipped: apply or undo it in this map and `client`'s."""
        op = request.op
        stmt = request.stmt
        assert stmt is not None
        if op == Op.PARSE or op == Op.INJECT or op == Op.PARSE_HIT:
            if ok:
                if op != Op.PARSE_HIT and stmt not in self.lru:
                    # Forgotten meanwhile (an earlier Parse of it failed): it exists now.
                    self.registry.hold(stmt)
                    self.lru[stmt] = self.epoch
                return
            if op != Op.PARSE_HIT:
                self.forget_statement(stmt)
            if request.name is not None:
                self.forget_client(client, request.name, stmt)
        elif op == Op.EVICT:
            if ok or stmt in self.lru:
                self.registry.release(stmt)
            else:
                self.lru[stmt] = 0
                self.lru.move_to_end(stmt, last=False)
        elif op == Op.CLOSE:
            name = request.name
            assert name is not None
            if ok or client is None or name in client.names:
                self.registry.release(stmt)
            else:
                client.names[name] = stmt
        elif op == Op.STALE:
            if not ok:
                self.stale.add(stmt)  # skipped: the server may still have it

    def forget_statement(self, stmt: Statement) -> None:
        if stmt in self.lru:
            del self.lru[stmt]
            self.registry.release(stmt)

    def forget_client(self, client: ClientStatements | None, name: bytes,
                      stmt: Statement) -> None:
        if client is not None and client.names.get(name) is stmt:
            del client.names[name]
            self.registry.release(stmt)

    def clear(self, client: ClientStatements | None, queued: Iterable[Request]) -> None:
        """The server dropped every prepared statement (DEALLOCATE ALL, DISCARD ALL): so did
        the linked client. Parses still `queued` behind it will exist again."""
        release = self.registry.release
        for stmt in self.lru:
            release(stmt)
        self.lru.clear()
        self.stale.clear()
        if client is not None:
            for stmt in client.names.values():
                release(stmt)
            client.names.clear()
        for request in queued:
            op, parsed, name = request.op, request.stmt, request.name
            if parsed is None or op not in (Op.PARSE, Op.PARSE_HIT, Op.INJECT):
                continue
            if op != Op.PARSE_HIT and parsed not in self.lru:
                self.registry.hold(parsed)
                self.lru[parsed] = self.epoch
            if client is not None and name is not None and name not in client.names:
                self.registry.hold(parsed)
                client.names[name] = parsed

    def close(self, owned: list[Statement]) -> None:
        """The server is gone: give back every reference it held, and those its queued
        Closes `owned`."""
        release = self.registry.release
        for stmt in self.lru:
            release(stmt)
        self.lru.clear()
        for stmt in owned:
            release(stmt)
        self.stale.clear()
