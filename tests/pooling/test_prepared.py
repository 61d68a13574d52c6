"""Prepared-statement rewriting, sans-IO: client messages and server replies in, the exact
bytes each side gets out (pypool/pooling/prepared/).

`Link` plays the part of net/client.py and net/server.py: it feeds the client's messages to
`ServerStatements.from_client` and the server's replies to `reply`/`pop_ready`, writing what
they return where the glue would.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pypool.pooling.pool import PoolStats
from pypool.pooling.prepared import (
    READY,
    REPLACE,
    SWALLOW,
    WAIT,
    ClientStatements,
    Registry,
    ServerStatements,
    Tracking,
    driver_segment,
    parse_sql_command,
    unnamed_segment,
)
from pypool.pooling.prepared.registry import neutral_text
from pypool.pooling.prepared.requests import Wait
from pypool.protocol import messages as m

# --- messages ------------------------------------------------------------------------------


def msg(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def parse(name: bytes, sql: bytes, types: tuple[int, ...] = ()) -> bytes:
    body = name + b"\0" + sql + b"\0" + struct.pack("!H", len(types))
    return msg(b"P", body + b"".join(struct.pack("!I", t) for t in types))


def bind(stmt: bytes, portal: bytes = b"", params: tuple[bytes, ...] = ()) -> bytes:
    body = portal + b"\0" + stmt + b"\0" + struct.pack("!HH", 0, len(params))
    for p in params:
        body += struct.pack("!i", len(p)) + p
    return msg(b"B", body + struct.pack("!H", 0))


def describe(what: bytes, name: bytes) -> bytes:
    return msg(b"D", what + name + b"\0")


def close(what: bytes, name: bytes) -> bytes:
    return msg(b"C", what + name + b"\0")


def execute(portal: bytes = b"") -> bytes:
    return msg(b"E", portal + b"\0" + struct.pack("!I", 0))


def query(sql: bytes) -> bytes:
    return msg(b"Q", sql + b"\0")


SYNC = msg(b"S")
FLUSH = msg(b"H")
PARSE_COMPLETE = msg(b"1")
BIND_COMPLETE = msg(b"2")
CLOSE_COMPLETE = msg(b"3")
NO_DATA = msg(b"n")
ROW = msg(b"D", struct.pack("!Hi", 1, 1) + b"1")
ROW_DESCRIPTION = m.row_description([("x", 23)])
PARAM_DESCRIPTION = msg(b"t", struct.pack("!HI", 1, 23))


def complete(tag: bytes) -> bytes:
    return msg(b"C", tag + b"\0")


def ready(status: bytes | str = b"I") -> bytes:
    if isinstance(status, str):
        status = status.encode()
    return msg(b"Z", status)


def error(code: str, text: str) -> bytes:
    return m.error_response(text, code)


# --- the glue, in miniature ----------------------------------------------------------------


class Link:
    """One client on one server at a time, as net/ wires them."""

    def __init__(self, cap: int = 200, client_cap: int = 0,
                 registry: Registry | None = None, stats: PoolStats | None = None) -> None:
        self.registry = registry if registry is not None else Registry()
        self.stats = stats if stats is not None else PoolStats()
        self.client = ClientStatements(self.registry, client_cap)
        self.cap = cap
        self.server = self.new_server()
        self.to_server = b""
        self.to_client = b""
        self.readies = 0  # ReadyForQuery messages the client was given
        self.to_server = self.server.attach(self.client)

    def new_server(self) -> ServerStatements:
        return ServerStatements(self.registry, self.cap, self.stats)

    def move_to(self, server: ServerStatements) -> None:
        """The transaction ended; the next one lands on `server`."""
        assert self.server.detach()
        self.server = server
        self.to_server += server.attach(self.client)

    def send(self, *messages: bytes) -> object:
        st = self.server
        data = b"".join(messages)
        pos = 0
        while pos < len(data):
            kind = data[pos]
            end = pos + 1 + int.from_bytes(data[pos + 1 : pos + 5], "big")
            out = st.from_client(kind, data, pos, end)
            if out is WAIT:
                return data[pos:]
            self.to_server += data[pos:end] if out is None else out  # type: ignore[operator]
            pos = end
        if st.requests.tracking == Tracking.SYNTHETIC:
            self.to_client += st.requests.emit_synthetic()
        return None

    def reply(self, *messages: bytes) -> None:
        st = self.server
        rq = st.requests
        for raw in messages:
            kind, body = raw[0], raw[5:]
            if rq.tracking == Tracking.SYNTHETIC:
                self.to_client += rq.emit_synthetic()
            if rq.tracking:
                verdict = rq.reply(kind, body)
                if verdict == REPLACE:
                    self.to_client += rq.replacement
                elif verdict != SWALLOW:
                    self.to_client += raw
                if verdict == READY:
                    self.readies += 1
            else:
                if kind == ord("Z"):
                    if rq.queue:
                        rq.pop_ready(body[0])
                    self.readies += 1
                elif kind == ord("C") and body[:1] == b"D":
                    st.command_tag(body)
                elif kind == ord("E"):
                    raw = rq.renamed_error(body) or raw
                self.to_client += raw
            if rq.to_client:
                self.to_client += b"".join(rq.to_client)
                rq.to_client = None

    def take(self) -> tuple[bytes, bytes]:
        out = (self.to_server, self.to_client)
        self.to_server = self.to_client = b""
        return out


SQL = b"SELECT $1::int"
KEY_PARSE = parse(b"PYPOOL_1", SQL)


# --- Parse ---------------------------------------------------------------------------------


def test_named_parse_is_renamed_and_answered_by_the_server():
    link = Link()
    link.send(parse(b"s1", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    assert link.take() == (parse(b"PYPOOL_1", SQL) + SYNC, PARSE_COMPLETE + ready())
    assert link.client.names[b"s1"].name == b"PYPOOL_1"
    assert link.stats.client_parse_count == 1 and link.stats.server_parse_count == 1
    assert link.server.requests.queue == type(link.server.requests.queue)()


def test_parse_of_a_body_the_server_has_is_answered_by_the_pooler_in_order():
    registry = Registry()
    first = Link(registry=registry)
    first.send(parse(b"a", SQL), SYNC)
    first.reply(PARSE_COMPLETE, ready())
    server = first.server
    first.server.detach()
    second = Link(registry=registry)
    second.move_to(server)
    second.take()
    # Another statement before it: the synthesised ParseComplete waits for that one's reply.
    second.send(parse(b"other", b"SELECT 2"), parse(b"mine", SQL), bind(b"mine"), execute(),
                SYNC)
    assert second.to_server == (parse(b"PYPOOL_2", b"SELECT 2") + bind(b"PYPOOL_1")
                                + execute() + SYNC)
    assert second.to_client == b""
    second.reply(PARSE_COMPLETE, BIND_COMPLETE, ROW, complete(b"SELECT 1"), ready())
    assert second.to_client == (PARSE_COMPLETE + PARSE_COMPLETE + BIND_COMPLETE + ROW
                                + complete(b"SELECT 1") + ready())
    # The Parse and the Bind found PYPOOL_1 there (counted in the server's pool).
    assert server.stats is not None and server.stats.prepared_hits == 2


def test_synthesised_parse_complete_goes_out_at_once_when_nothing_is_owed():
    registry = Registry()
    first = Link(registry=registry)
    first.send(parse(b"a", SQL), SYNC)
    first.reply(PARSE_COMPLETE, ready())
    second = Link(registry=registry)
    first.server.detach()
    second.move_to(first.server)
    second.take()
    second.send(parse(b"b", SQL), FLUSH)
    assert second.take() == (FLUSH, PARSE_COMPLETE)


def test_unnamed_statements_and_portals_pass_through():
    link = Link()
    messages = (parse(b"", SQL), bind(b"", b"p1"), describe(b"P", b"p1"), execute(b"p1"),
                close(b"P", b"p1"), describe(b"S", b""), SYNC)
    link.send(*messages)
    assert link.to_server == b"".join(messages)
    link.reply(PARSE_COMPLETE, BIND_COMPLETE, ROW_DESCRIPTION, ROW, complete(b"SELECT 1"),
               CLOSE_COMPLETE, PARAM_DESCRIPTION, ROW_DESCRIPTION, ready())
    assert link.to_client.endswith(ready()) and link.readies == 1
    assert not link.server.requests.queue and not link.client.names


def test_duplicate_parse_fails_on_the_server_with_postgresqls_error():
    link = Link()
    link.send(parse(b"s1", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.take()
    # Sent as a Parse of the existing server-side name: the server fails it (42P05, or
    # 25P02 in a failed transaction block), skips to the Sync, and we name the client's.
    link.send(parse(b"s1", b"SELECT 2"), bind(b"s1"), execute(), SYNC)
    assert link.to_server == (parse(b"PYPOOL_1", b"SELECT 2") + bind(b"PYPOOL_1") + execute()
                              + SYNC)
    link.reply(error("42P05", 'prepared statement "PYPOOL_1" already exists'), ready("E"))
    assert link.take()[1] == (error("42P05", 'prepared statement "s1" already exists')
                              + ready("E"))
    # The client carries on: its statement is the first one.
    link.send(bind(b"s1"), execute(), SYNC)
    assert link.take()[0] == bind(b"PYPOOL_1") + execute() + SYNC
    assert link.client.names[b"s1"].key == SQL + b"\0\0\0"


def test_duplicate_in_the_same_pipeline():
    link = Link()
    link.send(parse(b"s1", SQL), parse(b"s1", SQL), SYNC)
    assert link.take() == (KEY_PARSE + KEY_PARSE + SYNC, b"")
    link.reply(PARSE_COMPLETE, error("42P05", 'prepared statement "PYPOOL_1" already exists'),
               ready())
    assert link.take()[1] == (PARSE_COMPLETE
                              + error("42P05", 'prepared statement "s1" already exists')
                              + ready())


def test_failed_parse_is_forgotten_and_the_name_can_be_parsed_again():
    link = Link()
    link.send(parse(b"s1", b"SELEC 1"), bind(b"s1"), execute(), SYNC)
    assert link.to_server == (parse(b"PYPOOL_1", b"SELEC 1") + bind(b"PYPOOL_1") + execute()
                              + SYNC)
    syntax = error("42601", 'syntax error at or near "SELEC"')
    link.reply(syntax, ready())
    assert link.take()[1] == syntax + ready()
    assert not link.client.names and not link.server.cache.lru
    assert not link.registry.statements  # nobody refers to the failed body any more
    link.send(parse(b"s1", SQL), SYNC)
    assert link.take()[0] == parse(b"PYPOOL_2", SQL) + SYNC


def test_skipped_close_is_undone():
    link = Link()
    link.send(parse(b"s1", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.take()
    # The Bind fails; the Close after it was skipped by the server, so s1 still exists.
    link.send(bind(b"", b"", (b"x",)), close(b"S", b"s1"), SYNC)
    link.reply(error("08P01", "bind message supplies 1 parameters"), ready())
    assert link.take()[1] == error("08P01", "bind message supplies 1 parameters") + ready()
    assert b"s1" in link.client.names


def test_bind_of_an_unknown_statement_is_26000():
    link = Link()
    # The server is made to fail in its place (so a transaction block aborts as it would).
    link.send(bind(b"nope"), execute(), SYNC)
    assert link.to_server == describe(b"S", b"PYPOOL_0") + execute() + SYNC
    link.reply(error("26000", 'prepared statement "PYPOOL_0" does not exist'), ready())
    assert link.take()[1] == (error("26000", 'prepared statement "nope" does not exist')
                              + ready())
    link.send(describe(b"S", b"nope"), SYNC)
    assert link.to_server == describe(b"S", b"PYPOOL_0") + SYNC
    link.reply(error("26000", 'prepared statement "PYPOOL_0" does not exist'), ready())
    assert link.take()[1] == (error("26000", 'prepared statement "nope" does not exist')
                              + ready())


def test_parse_of_a_known_body_in_a_failed_transaction_goes_to_the_server():
    link = Link()
    link.send(parse(b"a", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready("E"))
    link.take()
    link.send(parse(b"b", SQL), SYNC)
    # Not answered by the pooler: the server says 25P02 (or ParseComplete for a ROLLBACK).
    assert link.to_server == parse(b"PYPOOL_0", SQL) + close(b"S", b"PYPOOL_0") + SYNC
    aborted = error("25P02", "current transaction is aborted")
    link.reply(aborted, ready("E"))
    assert link.take()[1] == aborted + ready("E")
    assert b"b" not in link.client.names


# --- a statement on another server ---------------------------------------------------------


def test_bind_on_a_server_without_the_statement_injects_a_parse_and_swallows_its_reply():
    link = Link()
    link.send(parse(b"s1", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.take()
    link.move_to(link.new_server())
    link.send(bind(b"s1", params=(b"7",)), execute(), SYNC)
    assert link.to_server == KEY_PARSE + bind(b"PYPOOL_1", params=(b"7",)) + execute() + SYNC
    link.reply(PARSE_COMPLETE, BIND_COMPLETE, ROW, complete(b"SELECT 1"), ready())
    assert link.take()[1] == BIND_COMPLETE + ROW + complete(b"SELECT 1") + ready()
    assert link.stats.prepared_misses == 2 and link.stats.bind_count == 1
    # Known there now: no second Parse.
    link.send(describe(b"S", b"s1"), SYNC)
    assert link.take()[0] == describe(b"S", b"PYPOOL_1") + SYNC


def test_describe_on_a_server_without_the_statement():
    link = Link()
    link.send(parse(b"s1", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.move_to(link.new_server())
    link.take()
    link.send(describe(b"S", b"s1"), SYNC)
    assert link.to_server == KEY_PARSE + describe(b"S", b"PYPOOL_1") + SYNC
    link.reply(PARSE_COMPLETE, PARAM_DESCRIPTION, ROW_DESCRIPTION, ready())
    assert link.take()[1] == PARAM_DESCRIPTION + ROW_DESCRIPTION + ready()


def test_injected_parse_that_fails_reports_to_the_client_and_is_forgotten():
    link = Link()
    link.send(parse(b"s1", b"SELECT * FROM t"), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.move_to(link.new_server())
    link.take()
    link.send(bind(b"s1"), execute(), SYNC)
    missing = error("42P01", 'relation "t" does not exist')
    link.reply(missing, ready())
    assert link.take()[1] == missing + ready()
    assert not link.server.cache.lru and b"s1" in link.client.names


def test_server_error_naming_our_statement_names_the_clients():
    link = Link()
    link.send(parse(b"s1", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.take()
    link.send(bind(b"s1"), execute(), SYNC)
    link.reply(error("26000", 'prepared statement "PYPOOL_1" does not exist'), ready())
    assert link.take()[1] == (error("26000", 'prepared statement "s1" does not exist')
                              + ready())


# --- Close ---------------------------------------------------------------------------------


def test_close_is_answered_by_the_pooler_and_the_server_keeps_the_plan():
    link = Link()
    link.send(parse(b"s1", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.take()
    link.send(bind(b"s1"), execute(), close(b"S", b"s1"), SYNC)
    assert link.to_server == bind(b"PYPOOL_1") + execute() + SYNC
    link.reply(BIND_COMPLETE, complete(b"SELECT 1"), ready())
    assert link.take()[1] == (BIND_COMPLETE + complete(b"SELECT 1") + CLOSE_COMPLETE
                              + ready())
    assert not link.client.names and len(link.server.cache.lru) == 1
    # The same name for other SQL is a new statement.
    link.send(parse(b"s1", b"SELECT 2"), SYNC)
    assert link.take()[0] == parse(b"PYPOOL_2", b"SELECT 2") + SYNC


def test_close_of_an_unknown_statement_is_no_error():
    link = Link()
    link.send(close(b"S", b"never"), SYNC)
    assert link.take() == (SYNC, CLOSE_COMPLETE)


# --- the server's LRU ----------------------------------------------------------------------


def test_least_recently_used_statement_is_closed_to_make_room():
    link = Link(cap=2)
    for name, sql in ((b"a", b"SELECT 1"), (b"b", b"SELECT 2")):
        link.send(parse(name, sql), SYNC)
        link.reply(PARSE_COMPLETE, ready())
        link.move_to(link.server)  # a new transaction on the same server
    link.send(bind(b"a"), execute(), SYNC)  # a is now more recent than b
    link.reply(BIND_COMPLETE, complete(b"SELECT 1"), ready())
    link.move_to(link.server)
    link.take()
    link.send(parse(b"c", b"SELECT 3"), SYNC)
    assert link.to_server == (close(b"S", b"PYPOOL_2") + parse(b"PYPOOL_3", b"SELECT 3")
                              + SYNC)
    link.reply(CLOSE_COMPLETE, PARSE_COMPLETE, ready())
    assert link.take()[1] == PARSE_COMPLETE + ready()
    assert link.stats.prepared_evictions == 1
    assert [s.name for s in link.server.cache.lru] == [b"PYPOOL_1", b"PYPOOL_3"]
    # b lives on for the client: it comes back through an injected Parse.
    link.send(bind(b"b"), execute(), SYNC)
    assert link.to_server.startswith(close(b"S", b"PYPOOL_1") + parse(b"PYPOOL_2", b"SELECT 2"))


def test_statements_of_the_current_transaction_are_not_evicted():
    link = Link(cap=1)
    link.send(parse(b"a", b"SELECT 1"), bind(b"a", b"p"), parse(b"b", b"SELECT 2"),
              execute(b"p"), SYNC)
    # A Close of a would also close portal p: the cap is exceeded instead, for now.
    assert link.to_server == (parse(b"PYPOOL_1", b"SELECT 1") + bind(b"PYPOOL_1", b"p")
                              + parse(b"PYPOOL_2", b"SELECT 2") + execute(b"p") + SYNC)
    link.reply(PARSE_COMPLETE, BIND_COMPLETE, PARSE_COMPLETE, complete(b"SELECT 1"), ready())
    assert len(link.server.cache.lru) == 2
    link.move_to(link.server)
    link.take()
    link.send(parse(b"c", b"SELECT 3"), SYNC)
    assert link.to_server == (close(b"S", b"PYPOOL_1") + close(b"S", b"PYPOOL_2")
                              + parse(b"PYPOOL_3", b"SELECT 3") + SYNC)


def test_evicted_close_skipped_by_an_error_puts_the_statement_back():
    link = Link(cap=1)
    link.send(parse(b"a", b"SELECT 1"), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.move_to(link.server)
    link.take()
    link.send(bind(b"", b"", (b"x",)), parse(b"b", b"SELECT 2"), SYNC)
    link.reply(error("08P01", "bad bind"), ready())
    assert {s.name for s in link.server.cache.lru} == {b"PYPOOL_1"}  # b's Parse never ran
    assert b"b" not in link.client.names


# --- pipelines -----------------------------------------------------------------------------


def test_parse_whose_first_attempt_is_unanswered_in_an_earlier_segment_waits():
    link = Link()
    link.send(parse(b"s1", b"SELEC 1"), SYNC)
    rest = link.send(parse(b"s1", SQL), SYNC)
    assert rest == parse(b"s1", SQL) + SYNC and link.server.requests.blocked
    link.reply(error("42601", "syntax error"), ready())
    link.server.requests.blocked = False
    assert link.send(rest) is None  # the first failed: this one is a fresh Parse
    assert link.take()[0].endswith(parse(b"PYPOOL_2", SQL) + SYNC)


def test_same_segment_duplicate_needs_no_wait():
    link = Link()
    assert link.send(parse(b"s1", SQL), parse(b"s2", SQL), SYNC) is None
    assert link.to_server == parse(b"PYPOOL_1", SQL) + SYNC
    link.reply(PARSE_COMPLETE, ready())
    assert link.take()[1] == PARSE_COMPLETE + PARSE_COMPLETE + ready()


def test_server_error_before_the_sync_arrives_drops_the_rest_up_to_it():
    link = Link()
    link.send(parse(b"s1", b"SELEC"), FLUSH)
    link.reply(error("42601", "syntax error"))
    link.send(bind(b"s1"), execute(), SYNC)  # sent after the error: the server skips these
    assert link.take() == (parse(b"PYPOOL_1", b"SELEC") + FLUSH + SYNC,
                           error("42601", "syntax error"))
    link.reply(ready())
    assert link.take()[1] == ready()


def test_copy_and_notices_pass_through_while_tracking():
    link = Link()
    link.send(parse(b"s1", b"COPY t FROM STDIN"), bind(b"s1"), execute(), SYNC)
    notice = m.notice_response("hello")
    link.reply(notice, PARSE_COMPLETE, BIND_COMPLETE, msg(b"G", b"\0\0\0"))
    link.send(msg(b"d", b"1\n"), msg(b"c"))
    link.reply(complete(b"COPY 1"), ready())
    assert link.to_client == (notice + PARSE_COMPLETE + BIND_COMPLETE + msg(b"G", b"\0\0\0")
                              + complete(b"COPY 1") + ready())


# --- DEALLOCATE ALL, DISCARD ALL, SQL-level statements ------------------------------------


def test_discard_all_clears_the_maps():
    link = Link()
    link.send(parse(b"s1", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.send(query(b"DISCARD ALL"))
    link.reply(complete(b"DISCARD ALL"), ready())
    assert not link.client.names and not link.server.cache.lru and not link.registry.statements


def test_deallocate_all_via_the_extended_protocol_clears_the_maps():
    link = Link()
    link.send(parse(b"s1", SQL), parse(b"", b"DEALLOCATE ALL"), bind(b""), execute(), SYNC)
    link.reply(PARSE_COMPLETE, PARSE_COMPLETE, BIND_COMPLETE, complete(b"DEALLOCATE ALL"),
               ready())
    assert not link.client.names and not link.server.cache.lru


def test_sql_prepare_is_replayed_on_the_next_server():
    link = Link()
    text = b"PREPARE q (int) AS SELECT $1 + 1"
    link.send(query(text))
    assert link.to_server == query(text)
    link.reply(complete(b"PREPARE"), ready())
    assert link.client.sql == {b"q": text} and link.server.sql.names == {b"q": text}
    link.move_to(link.new_server())
    assert link.to_server.endswith(query(text))  # the hidden PREPARE
    link.take()
    link.send(query(b"EXECUTE q(1)"))
    assert link.to_server == query(b"EXECUTE q(1)")
    link.reply(complete(b"PREPARE"), ready(),  # the hidden one, swallowed
               ROW_DESCRIPTION, ROW, complete(b"SELECT 1"), ready())
    assert link.take()[1] == ROW_DESCRIPTION + ROW + complete(b"SELECT 1") + ready()
    assert link.readies == 1 + 1  # the PREPARE's and the EXECUTE's, not the hidden one's


def test_sql_names_of_another_client_are_dropped_first():
    registry = Registry()
    a = Link(registry=registry)
    a.send(query(b"PREPARE q AS SELECT 1"))
    a.reply(complete(b"PREPARE"), ready())
    server = a.server
    server.detach()
    b = Link(registry=registry)
    b.move_to(server)
    b.take()
    b.send(query(b"EXECUTE q"))
    assert b.to_server == query(b'DEALLOCATE "q"') + query(b"EXECUTE q")
    b.reply(complete(b"DEALLOCATE"), ready(), error("26000", 'prepared statement "q" does '
                                                             "not exist"), ready())
    assert b.take()[1] == error("26000", 'prepared statement "q" does not exist') + ready()


def test_a_failed_hidden_deallocate_is_settled_once():
    """Its error undoes it, its ReadyForQuery settles it: the undo count stays right (it was
    settled twice, and the server closed with a KeyError)."""
    registry = Registry()
    a = Link(registry=registry)
    a.send(query(b"PREPARE q AS SELECT 1"))
    a.reply(complete(b"PREPARE"), ready())
    server = a.server
    server.detach()
    b = Link(registry=registry)
    b.move_to(server)
    b.take()
    b.send(query(b"PREPARE q AS SELECT 2"))
    b.reply(error("26000", 'prepared statement "q" does not exist'), ready(),
            complete(b"PREPARE"), ready())
    assert b.take()[1] == complete(b"PREPARE") + ready()
    assert not server.requests.undoable and not server.requests.queue


def test_sql_deallocate_and_execute_of_a_protocol_level_statement():
    link = Link()
    link.send(parse(b"s1", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.take()
    link.send(query(b"EXECUTE s1(5)"))
    assert link.to_server == query(b'EXECUTE "PYPOOL_1"(5)')
    link.reply(ROW_DESCRIPTION, ROW, complete(b"SELECT 1"), ready())
    link.send(query(b"DEALLOCATE s1"))
    assert link.to_server.endswith(query(b'DEALLOCATE "PYPOOL_1"'))
    link.reply(complete(b"DEALLOCATE"), ready())
    assert not link.client.names and not link.server.cache.lru


@pytest.mark.parametrize(
    ("text", "verb", "name"),
    [
        (b"PREPARE foo AS SELECT 1", b"prepare", b"foo"),
        (b"  prepare Foo(int) as select $1", b"prepare", b"foo"),
        (b'PREPARE "Foo" AS SELECT 1', b"prepare", b"Foo"),
        (b"-- hi\nEXECUTE foo(1, 2)", b"execute", b"foo"),
        (b"/* x */ deallocate prepare foo", b"deallocate", b"foo"),
        (b"DEALLOCATE ALL", b"deallocate", b""),
        (b"DEALLOCATE PREPARE ALL", b"deallocate", b""),
        (b"DISCARD ALL", b"discard", b""),
        (b"PREPARE transaction AS SELECT 1", b"prepare", b"transaction"),
        (b"PREPARE transaction (int) AS SELECT $1", b"prepare", b"transaction"),
        (b"PREPARE foo/* c */AS SELECT 1", b"prepare", b"foo"),
    ],
)
def test_parse_sql_command(text: bytes, verb: bytes, name: bytes):
    command = parse_sql_command(text)
    assert command is not None and (command.verb, command.name) == (verb, name)


@pytest.mark.parametrize("text", [
    b"SELECT 1", b"EXPLAIN EXECUTE foo", b"PREPARED", b"",
    # two-phase commit: no statement is prepared, whatever the first word says
    b"PREPARE TRANSACTION 'gid'", b"prepare transaction E'g\\'id'",
    b"PREPARE TRANSACTION $$gid$$", b"PREPARE /* c */ TRANSACTION 'x'", b"PREPARE foo",
])
def test_parse_sql_command_ignores_others(text: bytes):
    assert parse_sql_command(text) is None


# --- limits and memory ---------------------------------------------------------------------


def test_per_client_cap():
    link = Link(client_cap=2)
    link.send(parse(b"a", b"SELECT 1"), parse(b"b", b"SELECT 2"), parse(b"c", b"SELECT 3"),
              SYNC)
    assert link.to_server.endswith(describe(b"S", b"PYPOOL_0") + SYNC)
    link.reply(PARSE_COMPLETE, PARSE_COMPLETE,
               error("26000", 'prepared statement "PYPOOL_0" does not exist'), ready())
    assert link.take()[1] == (PARSE_COMPLETE + PARSE_COMPLETE + error(
        "54000", "too many prepared statements for this client "
        "(max_client_prepared_statements = 2)") + ready())


def test_references_are_given_back():
    registry = Registry()
    link = Link(registry=registry)
    link.send(parse(b"a", b"SELECT 1"), parse(b"b", b"SELECT 1"), parse(b"c", b"SELECT 2"),
              SYNC)
    link.reply(PARSE_COMPLETE, PARSE_COMPLETE, ready())
    assert len(registry) == 2
    link.client.close()
    assert len(registry) == 2  # the server still has both
    link.server.detach()
    link.server.close()
    assert len(registry) == 0


def test_segments_of_known_statements_are_folded_into_their_sync():
    link = Link()
    link.send(parse(b"s1", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.take()
    link.send(bind(b"s1"), execute(), SYNC)
    # One entry: the hot path forwards BindComplete, rows, CommandComplete; done at Z.
    assert len(link.server.requests.queue) == 1 and link.server.requests.tracking == Tracking.HOT
    link.reply(BIND_COMPLETE, ROW, complete(b"SELECT 1"), ready())
    assert link.take() == (bind(b"PYPOOL_1") + execute() + SYNC,
                           BIND_COMPLETE + ROW + complete(b"SELECT 1") + ready())
    # A segment with a Parse to the server is not folded: its failure must be undone.
    link.send(parse(b"s2", b"SELECT 2"), bind(b"s2"), execute(), SYNC)
    assert len(link.server.requests.queue) == 4 and link.server.requests.tracking == Tracking.EACH


def test_unnamed_extended_segments_are_folded():
    link = Link()
    link.send(parse(b"", SQL), bind(b"", params=(b"1",)), describe(b"P", b""), execute(), SYNC)
    assert len(link.server.requests.queue) == 1 and link.server.requests.tracking == Tracking.HOT
    link.reply(PARSE_COMPLETE, BIND_COMPLETE, NO_DATA, complete(b"SELECT 1"), ready())
    assert link.readies == 1 and not link.server.requests.queue


def test_two_names_for_one_statement_in_a_segment_are_not_folded():
    link = Link()
    link.send(parse(b"a", SQL), parse(b"b", SQL), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.take()
    link.send(bind(b"a", params=(b"1",)), execute(), bind(b"b", params=(b"1", b"2")),
              execute(), SYNC)
    assert len(link.server.requests.queue) == 5  # an error must say whether it was a's or b's Bind
    link.reply(BIND_COMPLETE, complete(b"SELECT 1"),
               error("08P01", 'bind message supplies 2 parameters, but prepared statement '
                              '"PYPOOL_1" requires 1'), ready())
    assert link.take()[1].endswith(error(
        "08P01", 'bind message supplies 2 parameters, but prepared statement "b" requires 1')
        + ready())


def test_plain_queries_stay_on_the_hot_path():
    link = Link()
    link.send(query(b"SELECT 1"), query(b"SELECT 2"))
    assert link.server.requests.tracking == Tracking.HOT and len(link.server.requests.queue) == 2
    link.reply(ROW_DESCRIPTION, ROW, complete(b"SELECT 1"), ready())
    assert link.server.requests.tracking == Tracking.HOT and len(link.server.requests.queue) == 1


# --- a server whose statements went behind the pooler's back -------------------------------

MISSING = error("26000", 'prepared statement "PYPOOL_1" does not exist')
DO_DEALLOCATE = b"DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$"


def test_a_26000_for_our_statement_forgets_the_cache_and_the_next_bind_parses_it_again():
    """A folded segment on the hot path (the steady state): the error reaches this one
    request, under the client's name; the next Bind closes and parses the statement again."""
    link = prepared_link(Registry())
    link.send(bind(b"s", params=(b"1",)), execute(), SYNC)
    assert link.server.requests.tracking == Tracking.HOT
    link.reply(MISSING, ready())
    assert link.take()[1] == error("26000", 'prepared statement "s" does not exist') + ready()
    assert not link.server.cache.lru and link.client.names  # the client still has "s"
    link.send(bind(b"s", params=(b"2",)), execute(), SYNC)
    assert link.to_server == (close(b"S", b"PYPOOL_1") + KEY_PARSE
                              + bind(b"PYPOOL_1", params=(b"2",)) + execute() + SYNC)
    link.reply(CLOSE_COMPLETE, PARSE_COMPLETE, BIND_COMPLETE, ROW, complete(b"SELECT 1"),
               ready())
    assert link.take()[1] == BIND_COMPLETE + ROW + complete(b"SELECT 1") + ready()
    assert list(link.server.cache.lru) == [link.client.names[b"s"]] and not link.server.cache.stale


def test_a_26000_on_the_tracked_path_heals_too():
    link = prepared_link(Registry())
    link.send(bind(b"s", params=(b"1",)), FLUSH)  # no Sync yet: read reply by reply
    link.reply(MISSING)
    assert link.take()[1] == error("26000", 'prepared statement "s" does not exist')
    link.send(execute(), SYNC)
    assert link.to_server == SYNC  # the server skips to it
    link.reply(ready())
    link.take()
    link.send(describe(b"S", b"s"), SYNC)
    assert link.to_server == (close(b"S", b"PYPOOL_1") + KEY_PARSE
                              + describe(b"S", b"PYPOOL_1") + SYNC)


def test_a_query_that_may_deallocate_unseen_makes_the_cache_distrusted_when_it_is_done():
    """No 26000 at all: the Bind after the DO block parses its statement again."""
    link = prepared_link(Registry())
    link.send(query(DO_DEALLOCATE))
    link.send(bind(b"s"), execute(), SYNC)  # pipelined behind it: waits for its outcome
    assert link.to_server == query(DO_DEALLOCATE) and link.server.requests.blocked
    link.take()
    link.reply(complete(b"DO"), ready())
    assert not link.server.cache.lru
    link.server.requests.blocked = False
    link.send(bind(b"s"), execute(), SYNC)
    assert link.to_server == close(b"S", b"PYPOOL_1") + KEY_PARSE + bind(b"PYPOOL_1") + (
        execute() + SYNC)


def test_a_prepared_do_block_is_distrusted_at_its_sync():
    link = prepared_link(Registry())
    link.send(parse(b"d", DO_DEALLOCATE), bind(b"d"), execute(), SYNC)
    link.reply(PARSE_COMPLETE, BIND_COMPLETE, complete(b"DO"), ready())
    assert not link.server.cache.lru
    assert link.server.bind_segment(bind(b"d") + execute() + SYNC, len(bind(b"d"))) is None
    # The unnamed statement too.
    link = prepared_link(Registry())
    link.send(parse(b"", DO_DEALLOCATE), bind(b""), execute(), SYNC)
    link.reply(PARSE_COMPLETE, BIND_COMPLETE, complete(b"DO"), ready())
    assert not link.server.cache.lru


@pytest.mark.parametrize("sql", [b"SELECT 1", b"UPDATE t SET prepared = true",
                                 b"DELETE FROM t WHERE x = 1"])
def test_statements_that_cannot_deallocate_leave_the_cache_alone(sql: bytes):
    link = prepared_link(Registry())
    link.send(query(sql))
    link.reply(complete(b"SELECT 1"), ready())
    link.send(parse(b"", sql), bind(b""), execute(), SYNC)
    link.reply(PARSE_COMPLETE, BIND_COMPLETE, complete(b"SELECT 1"), ready())
    assert len(link.server.cache.lru) == 1


def test_a_deallocate_in_a_multi_statement_query_distrusts_the_cache():
    link = prepared_link(Registry())
    link.send(query(b"SELECT 1; DEALLOCATE x"))  # the hot path: only its tags are seen
    link.reply(ROW_DESCRIPTION, ROW, complete(b"SELECT 1"), complete(b"DEALLOCATE"), ready())
    assert not link.server.cache.lru and link.server.cache.stale


def test_a_prepare_in_a_multi_statement_query_is_dropped_before_another_clients():
    registry = Registry()
    a = Link(registry=registry)
    a.send(query(b"PREPARE q AS SELECT 1; SELECT 1/0"))
    a.reply(complete(b"PREPARE"), error("22012", "division by zero"), ready())
    assert a.server.sql.names == {b"q": b""} and not a.client.sql  # the server has some "q"
    server = a.server
    server.detach()
    b = Link(registry=registry)
    b.move_to(server)
    b.take()
    b.send(query(b"PREPARE q AS SELECT 2"))
    # A Close, which cannot fail whether or not the server has it, then the client's own.
    assert b.to_server == close(b"S", b"q") + SYNC + query(b"PREPARE q AS SELECT 2")
    b.reply(CLOSE_COMPLETE, ready(), complete(b"PREPARE"), ready())
    assert b.take()[1] == complete(b"PREPARE") + ready()
    assert server.sql.names == {b"q": b"PREPARE q AS SELECT 2"}


def test_prepare_transaction_is_no_statement_and_is_never_replayed():
    """Two-phase commit's PREPARE TRANSACTION 'gid': not a statement named `transaction`,
    so nothing is recorded, dropped before the next one, or replayed on another server."""
    registry = Registry()
    a = Link(registry=registry)
    text = b"PREPARE TRANSACTION 'gid-1'"
    a.send(query(b"BEGIN"))
    a.reply(complete(b"BEGIN"), ready(b"T"))
    a.take()
    a.send(query(text))
    assert a.to_server == query(text)  # alone: no hidden DEALLOCATE before it
    a.reply(complete(b"PREPARE TRANSACTION"), ready())
    # nothing to replay
    assert not a.client.sql and not a.server.sql.names and not a.server.cache.stale
    server = a.server
    server.detach()
    b = Link(registry=registry)
    b.move_to(server)
    b.take()
    b.send(query(b"PREPARE TRANSACTION 'gid-2'"))
    assert b.to_server == query(b"PREPARE TRANSACTION 'gid-2'")


def test_an_unsure_name_is_closed_inside_an_open_segment_without_a_sync():
    """A Sync would end the client's open extended segment, and a DEALLOCATE of a name the
    server may not have would fail and abort its transaction: a lone Close, in the segment."""
    registry = Registry()
    a = Link(registry=registry)
    a.send(query(b"PREPARE q AS SELECT 1; SELECT 1/0"))
    a.reply(complete(b"PREPARE"), error("22012", "division by zero"), ready())
    assert a.server.sql.names == {b"q": b""}
    server = a.server
    server.detach()
    b = Link(registry=registry)
    b.move_to(server)
    b.take()
    b.send(parse(b"", b"SELECT 2"), bind(b""), execute(), query(b"PREPARE q AS SELECT 2"))
    assert b.to_server.endswith(close(b"S", b"q") + query(b"PREPARE q AS SELECT 2"))
    assert SYNC not in b.to_server and b"DEALLOCATE" not in b.to_server


def test_a_client_sql_statement_is_prepared_again_on_a_distrusted_server():
    registry = Registry()
    a = Link(registry=registry)
    text = b"PREPARE q AS SELECT 1"
    a.send(query(text))
    a.reply(complete(b"PREPARE"), ready())
    server = a.server
    a.move_to(a.new_server())
    a.reply(complete(b"PREPARE"), ready())  # the hidden one
    server.distrust("test")
    a.move_to(server)
    assert a.to_server.endswith(close(b"S", b"q") + SYNC + query(text))


def test_a_duplicate_parse_that_succeeds_means_the_server_had_lost_the_statement():
    link = prepared_link(Registry())
    link.send(parse(b"s", b"SELECT 2"), SYNC)
    assert link.to_server == parse(b"PYPOOL_1", b"SELECT 2") + SYNC
    link.reply(PARSE_COMPLETE, ready())  # PostgreSQL would have said 42P05
    assert not link.server.cache.lru and link.client.names[b"s"] in link.server.cache.stale
    link.take()
    link.send(bind(b"s"), execute(), SYNC)
    assert link.to_server.startswith(close(b"S", b"PYPOOL_1") + KEY_PARSE)


def test_a_skipped_close_of_a_stale_statement_stays_stale():
    link = prepared_link(Registry())
    link.server.distrust("test")
    link.send(bind(b"s"), execute(), SYNC)
    link.reply(error("25P02", "current transaction is aborted"), ready("E"))
    stmt = link.client.names[b"s"]
    assert stmt in link.server.cache.stale and not link.server.cache.lru
    assert not link.server.requests.undoable


def test_stale_statements_nobody_uses_are_not_kept():
    registry = Registry()
    link = prepared_link(registry)
    link.server.distrust("test")
    link.send(close(b"S", b"s"), SYNC)
    link.reply(ready())
    assert not registry.statements
    link.server.distrust("again")
    assert not link.server.cache.stale


# --- the driver fast path and the pipelining verdict ----------------------------------------


def prepared_link(registry: Registry, sql: bytes = SQL) -> Link:
    """A client whose statement "s" is prepared on its server, the replies all in."""
    link = Link(registry=registry)
    link.send(parse(b"s", sql), SYNC)
    link.reply(PARSE_COMPLETE, ready())
    link.take()
    return link


def state(st: ServerStatements) -> tuple[object, ...]:
    """What a ServerStatements holds, statements by name (two registries never share one)."""
    def named(value: object) -> object:
        if isinstance(value, (tuple, list)):
            return type(value)(named(item) for item in value)
        return getattr(value, "name", value)

    rq = st.requests
    return (named([(r.wait, r.swallow, r.op, r.stmt, r.name, r.segment, r.payload)
                   for r in rq.queue]),
            rq.tracking, rq.readies_queued, rq.segment,
            st.last_neutral, rq.open_count, [(k.name, v) for k, v in st.cache.lru.items()])


@pytest.mark.parametrize("tail", [describe(b"P", b"") + execute() + SYNC, execute() + SYNC])
def test_bind_segment_does_what_message_by_message_does(tail: bytes) -> None:
    fast, slow = prepared_link(Registry()), prepared_link(Registry())
    data = bind(b"s", params=(b"7",)) + tail
    bind_end = driver_segment(data)
    assert bind_end == len(bind(b"s", params=(b"7",)))
    out = fast.server.bind_segment(data, bind_end)
    slow.send(data)
    assert out == slow.to_server == bind(b"PYPOOL_1", params=(b"7",)) + tail
    assert state(fast.server) == state(slow.server)
    assert (fast.stats.prepared_hits, fast.stats.bind_count) == (
        slow.stats.prepared_hits, slow.stats.bind_count)
    # The replies stream through to the ReadyForQuery either way.
    for link in (fast, slow):
        link.reply(BIND_COMPLETE, ROW_DESCRIPTION, ROW, complete(b"SELECT 1"), ready())
        assert link.to_client.endswith(ready()) and not link.server.requests.queue


def test_bind_segment_leaves_the_rest_to_the_general_path() -> None:
    link = prepared_link(Registry())
    st = link.server
    unknown = bind(b"nope") + execute() + SYNC
    assert st.bind_segment(unknown, driver_segment(unknown)) is None
    unnamed = bind(b"") + execute() + SYNC
    assert st.bind_segment(unnamed, driver_segment(unnamed)) is None
    # A statement this server lacks needs a Parse first.
    other = Link(registry=link.registry)
    other.client.names[b"s"] = link.client.names[b"s"]
    data = bind(b"s") + execute() + SYNC
    assert other.server.bind_segment(data, driver_segment(data)) is None
    # nothing was queued on the way
    assert not st.requests.queue and not other.server.requests.queue


@pytest.mark.parametrize("data", [
    bind(b"s") + execute() + FLUSH,
    bind(b"s") + execute(),
    bind(b"s") + msg(b"E", b"\0" + struct.pack("!I", 10)) + SYNC,  # a row limit
    bind(b"s") + describe(b"S", b"s") + execute() + SYNC,
    parse(b"s", SQL) + bind(b"s") + execute() + SYNC,
    execute() + SYNC,
])
def test_driver_segment_is_only_that_shape(data: bytes) -> None:
    assert driver_segment(data) == 0


def whole_state(st: ServerStatements) -> tuple[object, ...]:
    """`state`, and what the unnamed statement and the open segment leave for the next."""
    rq = st.requests
    return (state(st), st.unnamed_neutral, st.unnamed_touches, st.open_neutral,
            st.open_touches, rq.open_fine, dict(rq.undoable or {}), rq.discarding)


@pytest.mark.parametrize("sql", [SQL, b"  (select 1)", b"UPDATE t SET x = 1", b"BEGIN"])
@pytest.mark.parametrize("tail", [describe(b"P", b"") + execute() + SYNC, execute() + SYNC])
@pytest.mark.parametrize("before", [b"", query(b"SELECT 2"), parse(b"", b"INSERT 1") + bind(b"")
                                    + execute() + SYNC, parse(b"q", SQL) + SYNC])
def test_plain_segment_does_what_message_by_message_does(sql: bytes, tail: bytes,
                                                         before: bytes) -> None:
    """pgbench -M extended's transaction in one step: the same queue, the same verdict for
    pipelining (last_neutral), the same memory of the unnamed statement, whatever is
    still owed before it."""
    fast, slow = prepared_link(Registry()), prepared_link(Registry())
    data = parse(b"", sql, (23,)) + bind(b"", params=(b"7",)) + tail
    assert unnamed_segment(data)
    for link in (fast, slow):
        link.send(before)  # its replies still to come
    # After a simple Query the segment counts as open (its Sync is still to come): message
    # by message there.
    if fast.server.plain_segment(data):
        assert not before.startswith(b"Q")
    else:
        assert before.startswith(b"Q")
        fast.send(data)
    slow.send(data)
    assert whole_state(fast.server) == whole_state(slow.server)
    # The replies stream through to the client either way, and leave the same behind.
    replies = [PARSE_COMPLETE, BIND_COMPLETE, ROW_DESCRIPTION, ROW, complete(b"SELECT 1"),
               ready()]
    if tail == execute() + SYNC:
        replies.remove(ROW_DESCRIPTION)
    earlier = {b"": [], query(b"SELECT 2"): [ROW_DESCRIPTION, ROW, complete(b"SELECT 1"),
                                            ready()],
               parse(b"q", SQL) + SYNC: [PARSE_COMPLETE, ready()]}.get(
                   before, [PARSE_COMPLETE, BIND_COMPLETE, complete(b"INSERT 0 1"), ready()])
    for link in (fast, slow):
        link.reply(*earlier, *replies)
        assert link.to_client.endswith(b"".join(replies)) and not link.server.requests.queue
    assert whole_state(fast.server) == whole_state(slow.server)


def test_plain_segment_leaves_the_rest_to_the_general_path() -> None:
    link = prepared_link(Registry())
    st = link.server
    # A text that may drop the server's statements: its Sync must distrust the cache.
    touching = parse(b"", DO_DEALLOCATE) + bind(b"") + execute() + SYNC
    assert unnamed_segment(touching) and not st.plain_segment(touching)
    # Not that shape: a named Parse goes message by message.
    assert not st.plain_segment(parse(b"s2", SQL) + bind(b"s2") + execute() + SYNC)
    # A segment already open (a Parse sent with no Sync yet).
    plain = parse(b"", SQL) + bind(b"") + execute() + SYNC
    link.send(parse(b"", SQL))
    assert not st.plain_segment(plain)
    link.send(SYNC)
    # The skip to the next Sync after a server error.
    link.send(bind(b"missing"))
    link.reply(PARSE_COMPLETE, ready())
    st.requests.discarding = True
    assert not st.plain_segment(plain)
    assert [r.wait for r in st.requests.queue] == [Wait.DESCRIBE]  # only the failing Bind's


@pytest.mark.parametrize("data", [
    parse(b"s", SQL) + bind(b"s") + execute() + SYNC,  # named
    parse(b"", SQL) + bind(b"s") + execute() + SYNC,
    parse(b"", SQL) + bind(b"", b"p") + execute(b"p") + SYNC,  # a named portal
    parse(b"", SQL) + bind(b"") + execute() + FLUSH,
    parse(b"", SQL) + bind(b"") + execute(),
    parse(b"", SQL) + bind(b"") + msg(b"E", b"\0" + struct.pack("!I", 10)) + SYNC,
    parse(b"", SQL) + bind(b"") + describe(b"S", b"") + execute() + SYNC,
    parse(b"", SQL) + SYNC + bind(b"") + execute() + SYNC,
    parse(b"", SQL) + execute() + SYNC + SYNC,
    bind(b"") + execute() + SYNC,
])
def test_unnamed_segment_is_only_that_shape(data: bytes) -> None:
    assert not unnamed_segment(data)


@pytest.mark.parametrize(("sql", "neutral"), [
    (b"SELECT $1::int", True),
    (b"  insert into t values ($1)", True),
    (b"WITH x AS (SELECT 1) SELECT * FROM x", True),
    (b"BEGIN", False),
    (b"COMMIT", False),
    (b"/* a comment */ SELECT 1", False),
    (b"CALL p()", False),
])
def test_a_segment_is_neutral_only_with_neutral_statements(sql: bytes, neutral: bool) -> None:
    link = prepared_link(Registry(), sql)
    link.send(bind(b"s"), describe(b"P", b""), execute(), SYNC)
    assert link.server.last_neutral is neutral


def test_a_segment_with_a_named_parse_is_not_neutral() -> None:
    link = prepared_link(Registry())
    replies = (PARSE_COMPLETE, BIND_COMPLETE, ROW, complete(b"SELECT 1"), ready())
    link.send(parse(b"t", b"SELECT 2"), bind(b"t"), execute(), SYNC)
    assert link.server.last_neutral is False
    link.reply(*replies)
    link.send(bind(b"s"), execute(), SYNC)
    assert link.server.last_neutral is True


@pytest.mark.parametrize(("sql", "neutral"), [
    (b"SELECT 3", True), (b"BEGIN", False), (b"ROLLBACK", False), (b"-- x\nSELECT 1", False),
])
def test_the_unnamed_statement_is_neutral_by_its_text(sql: bytes, neutral: bool) -> None:
    link = prepared_link(Registry())
    link.send(parse(b"", sql), bind(b""), describe(b"P", b""), execute(), SYNC)
    assert link.server.last_neutral is neutral
    link.reply(PARSE_COMPLETE, BIND_COMPLETE, NO_DATA, complete(b"SELECT 1"), ready())
    # A Bind of it in a later segment goes by the same text.
    link.send(bind(b""), execute(), SYNC)
    assert link.server.last_neutral is neutral


_NEUTRAL = (b"select", b"insert", b"update", b"delete", b"with", b"values", b"table")


def _neutral_by_its_words(text: bytes) -> bool:
    """What `neutral_text` answers, read the plain way: past whitespace and parentheses,
    the first word (ASCII letters, digits, "_") is one of the neutral ones, in any case."""
    rest = text.lstrip(b" \t\n\r\f\v(")
    end = 0
    while end < len(rest) and (chr(rest[end]).isascii()
                               and (chr(rest[end]).isalnum() or rest[end] == 95)):
        end += 1
    return rest[:end].lower() in _NEUTRAL


@given(lead=st.sampled_from([b"", b" ", b"(", b"\t( \n"]),
       word=st.one_of(st.sampled_from(_NEUTRAL + (b"selects", b"sel3ct", b"_elect", b"with_",
                                                  b"tabl", b"show", b"valuesx")),
                      st.binary(max_size=8)),
       flips=st.lists(st.booleans(), max_size=8),
       tail=st.sampled_from([b"", b" 1", b"(x", b"\x80", b"@", b"[", b"_1", b"9"]))
def test_a_first_word_is_neutral_in_any_case_and_only_when_it_is_one(
        lead: bytes, word: bytes, flips: list[bool], tail: bytes) -> None:
    # The word is compared folded into an int (registry.py `_word_code`): no case of a
    # neutral word may be missed, and no other word or byte may fold into one.
    cased = bytes(byte ^ 32 if flip and chr(byte).isalpha() and byte < 128 else byte
                  for byte, flip in zip(word, flips + [False] * len(word), strict=False))
    text = lead + cased + tail
    assert neutral_text(text, 0) is _neutral_by_its_words(text)


@pytest.mark.parametrize(("sql", "neutral"), [
    (b"SELECT abalance FROM pgbench_accounts WHERE aid = 1;", True),
    (b"select 1", True),
    (b"SELECT 1; BEGIN", False),
    (b"SELECT ';'", False),  # a semicolon anywhere but at the end: not looked into
    (b"BEGIN", False),
    (b"UPDATE t SET x = 1;;", True),
])
def test_a_simple_query_is_neutral_when_it_is_one_neutral_statement(sql: bytes,
                                                                    neutral: bool) -> None:
    link = Link()
    link.send(query(sql))
    assert link.server.last_neutral is None  # not looked at until asked
    assert link.server.neutral_tail() is neutral
    assert link.server.last_neutral is neutral
