"""The session-state classifier: which statements change a server's session, read from their
first keywords (pooling/session_state/)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pypool.pooling import session_state as ss
from pypool.pooling.session_state import Command, candidate, classify


def kinds(sql: str) -> list[int]:
    return [c.kind for c in classify(sql.encode())]


@pytest.mark.parametrize(("sql", "expected"), [
    ("SET search_path = a, b", [Command(ss.SET, b"search_path", b"SET search_path = a, b")]),
    ("set statement_timeout to 5;", [Command(ss.SET, b"statement_timeout",
                                             b"set statement_timeout to 5")]),
    ("SET SESSION work_mem = '8MB'", [Command(ss.SET, b"work_mem", b"SET work_mem = '8MB'")]),
    ("SET TIME ZONE 'UTC'", [Command(ss.SET, b"timezone", b"SET TIME ZONE 'UTC'")]),
    ("SET myapp.user_id = 7", [Command(ss.SET, b"myapp.user_id", b"SET myapp.user_id = 7")]),
    ('SET "Work_Mem" = 1', [Command(ss.SET, b"work_mem", b'SET "Work_Mem" = 1')]),
    ("SET ROLE other", [Command(ss.SET, ss.ROLE, b"SET ROLE other")]),
    ("SET SESSION AUTHORIZATION other",
     [Command(ss.SET, ss.SESSION_AUTHORIZATION, b"SET SESSION AUTHORIZATION other")]),
    ("RESET ROLE", [Command(ss.RESET, ss.ROLE)]),
    ("RESET SESSION AUTHORIZATION", [Command(ss.RESET, ss.SESSION_AUTHORIZATION)]),
    ("reset work_mem", [Command(ss.RESET, b"work_mem")]),
    ("RESET ALL", [Command(ss.RESET_ALL)]),
    ("DISCARD ALL", [Command(ss.DISCARD_ALL)]),
    ("DISCARD TEMP", [Command(ss.DISCARD_TEMP)]),
    ("DISCARD TEMPORARY", [Command(ss.DISCARD_TEMP)]),
    ("DISCARD PLANS", []),
    ("LISTEN chan", [Command(ss.LISTEN, b"chan")]),
    ("UNLISTEN chan", [Command(ss.UNLISTEN, b"chan")]),
    ("UNLISTEN *", [Command(ss.UNLISTEN_ALL)]),
    ("CREATE TEMP TABLE t (a int)", [Command(ss.TEMP_TABLE)]),
    ("create local temporary table t (a int)", [Command(ss.TEMP_TABLE)]),
    # Dropped when its transaction ends: nothing outlives it.
    ("CREATE TEMP TABLE t (x int, y text) ON COMMIT DROP", []),
    ("create temp table t (x int) on  commit\n drop", []),
    ("CREATE TEMP TABLE t (x int) ON COMMIT DELETE ROWS", [Command(ss.TEMP_TABLE)]),
    ("CREATE TABLE pg_temp.t (a int)", [Command(ss.TEMP_TABLE)]),
    ("CREATE TABLE IF NOT EXISTS pg_temp.t (a int)", [Command(ss.TEMP_TABLE)]),
    ("CREATE TABLE t (a int)", []),
    ("DECLARE c CURSOR WITH HOLD FOR SELECT 1", [Command(ss.HOLD_CURSOR)]),
    ("DECLARE c NO SCROLL CURSOR WITH HOLD FOR SELECT 1", [Command(ss.HOLD_CURSOR)]),
    ("DECLARE c CURSOR FOR SELECT 'with hold'", []),
    ("DECLARE c CURSOR WITHOUT HOLD FOR SELECT 1", []),
    ("CLOSE ALL", [Command(ss.CLOSE_ALL)]),
    ("LOAD 'auto_explain'", [Command(ss.LOAD)]),
    ("SELECT pg_advisory_lock(1)", [Command(ss.LOCK)]),
    ("SELECT pg_try_advisory_lock_shared(1), PG_ADVISORY_LOCK(2)",
     [Command(ss.LOCK), Command(ss.LOCK)]),
    ("SELECT pg_advisory_unlock(1)", [Command(ss.UNLOCK)]),
    ("SELECT pg_advisory_unlock_all()", [Command(ss.UNLOCK_ALL)]),
    ("SELECT pg_advisory_xact_lock(1)", []),
    ("SELECT set_config('search_path', 'a, b', false)",
     [Command(ss.SET, b"search_path",
              b"SELECT pg_catalog.set_config(E'search_path', E'a, b', false)")]),
    ("SELECT set_config('search_path', 'a', true)", []),
    ("SELECT set_config('x.y', $1, false)", [Command(ss.UNTRACKABLE, b"set_config")]),
    ("SET LOCAL work_mem = 1", []),
    ("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", []),
    ("SET CONSTRAINTS ALL DEFERRED", []),
    ("SET work_mem = 1; SELECT 1", [Command(ss.UNTRACKABLE, b"work_mem")]),
    ("SET a.b = 1; RESET c ;; SET d = 'x;y';", [Command(ss.SET, b"a.b", b"SET a.b = 1"),
                                                Command(ss.RESET, b"c"),
                                                Command(ss.SET, b"d", b"SET d = 'x;y'")]),
    ("SET a = 1; LISTEN x", [Command(ss.UNTRACKABLE, b"a")]),
    ("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
     [Command(ss.UNTRACKABLE, b"session characteristics")]),
    ("SELECT 1", []),
    ("DELETE FROM t", []),
    ("COMMIT", []),
    ("/* c */ -- line\n  SET work_mem = 1", [Command(ss.SET, b"work_mem",
                                                    b"SET work_mem = 1")]),
    ("(SELECT pg_advisory_lock(1))", [Command(ss.LOCK)]),
    ("ROLLBACK", [Command(ss.ROLLBACK)]),
    ("abort work", [Command(ss.ROLLBACK)]),
    ("ROLLBACK TO SAVEPOINT s", [Command(ss.ROLLBACK_TO)]),
    ("ROLLBACK TRANSACTION TO s", [Command(ss.ROLLBACK_TO)]),
    ("ROLLBACK PREPARED 'x'", []),
    # Forms that begin like another (tests/integration/test_sql_keywords.py checks them all
    # against PostgreSQL).
    ("RESET TIME ZONE", [Command(ss.RESET, b"timezone")]),
    ("RESET TRANSACTION ISOLATION LEVEL", []),
    ("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE", []),
    ("SET SESSION SESSION AUTHORIZATION app",
     [Command(ss.SET, ss.SESSION_AUTHORIZATION, b"SET SESSION AUTHORIZATION app")]),
    ("SET SESSION SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
     [Command(ss.UNTRACKABLE, b"session characteristics")]),
    ("PREPARE TRANSACTION 'x'", []),
    ("COMMIT PREPARED 'x'", []),
])
def test_classify(sql: str, expected: list[Command]) -> None:
    assert classify(sql.encode()) == expected


@pytest.mark.parametrize(("sql", "found"), [
    ("SELECT abalance FROM pgbench_accounts WHERE aid = 1", None),
    ("SELECT pg_advisory_lock(1)", [Command(ss.LOCK)]),
    ("SELECT PG_ADVISORY_LOCK(1)", [Command(ss.LOCK)]),
    ("SELECT 'advisory'", None),  # no call: not even read
    ("SELECT 'advisory', f(1)", []),  # read, and nothing found
    ("SELECT a FROM t WHERE b IN (1, 2)", None),
    ("DELETE FROM t", None),
    ("LISTEN c", [Command(ss.LISTEN, b"c")]),
    ("", None),
])
def test_look_at_a_query_and_a_parse(sql: str, found: list[Command] | None) -> None:
    text = sql.encode() + b"\x00"
    query = b"Q" + (len(text) + 4).to_bytes(4, "big") + text
    assert ss.look(ord("Q"), query, 0, len(query)) == found
    body = b"name\x00" + text + b"\x00\x00"
    parse = b"P" + (len(body) + 4).to_bytes(4, "big") + body
    assert ss.look(ord("P"), parse, 0, len(parse)) == found


@pytest.mark.parametrize("sql", ["", ";", "x", "SELECT 1"])
def test_look_at_a_short_query_with_a_semicolon_later_in_the_read(sql: str) -> None:
    """The look reads a Query in place, with what follows it in the same read: a semicolon
    there is not the Query's (an empty Query's text ends before it starts; compiled code
    must not slice backwards)."""
    text = sql.encode() + b"\x00"
    query = b"Q" + (len(text) + 4).to_bytes(4, "big") + text
    data = query + b"Q\x00\x00\x00\x0eSELECT 1; ;\x00"
    assert ss.look(ord("Q"), data, 0, len(query)) is None


@pytest.mark.parametrize("body", [
    b"SET\x00\x00",  # a NUL, then more: "invalid message format"
    b"SET x = 1\x00junk\x00",
    b"SET x = 1",  # no NUL at all: "invalid string in message"
    b"SELECT 1; PREPARE p AS SELECT 2\x00\x00",
    b"SELECT pg_advisory_lock(1)\x00 \x00",
])
def test_a_query_postgresql_refuses_whole_changes_nothing(body: bytes) -> None:
    """PostgreSQL reads a Query's text up to its first NUL and refuses the message when
    more follows or no NUL ends it: nothing in it runs, so the look finds nothing. (Found
    by tests/net/test_two_clients.py: `SET` and two NULs was recorded as a SET of a
    parameter named NUL, and the next client on that server was sent `RESET "\\0"`, which
    PostgreSQL refused, and that client was dropped.)"""
    query = b"Q" + (len(body) + 4).to_bytes(4, "big") + body
    assert ss.look(ord("Q"), query, 0, len(query)) is None


@pytest.mark.parametrize(("sql", "found"), [
    ("SELECT abalance FROM t WHERE aid = 1;", None),  # a trailing `;`: one statement
    ("SELECT 1; PREPARE p AS SELECT 2", [Command(ss.UNTRACKABLE, b"prepare")]),
    ("SELECT 1;\n  prepare p AS SELECT 2;", [Command(ss.UNTRACKABLE, b"prepare")]),
    ("INSERT INTO t VALUES (1); /* c */ PREPARE p AS SELECT 2",
     [Command(ss.UNTRACKABLE, b"prepare")]),
    ("SELECT 'a;b'; SELECT 2", None),
    ("SELECT 'x; PREPARE p AS SELECT 1'", None),  # inside a literal
])
def test_a_prepare_behind_another_statement_pins(sql: str,
                                                 found: list[Command] | None) -> None:
    """Only a simple Query can hold several statements (a Parse of them fails)."""
    text = sql.encode() + b"\x00"
    query = b"Q" + (len(text) + 4).to_bytes(4, "big") + text
    assert ss.look(ord("Q"), query, 0, len(query)) == found


def test_set_with_quoted_semicolon_is_one_statement() -> None:
    found = classify(b"SET search_path = 'a;b' ;  ")
    assert found == [Command(ss.SET, b"search_path", b"SET search_path = 'a;b'")]
    assert kinds("SET application_name = E'x\\';y'") == [ss.SET]
    assert kinds("SET application_name = $q$;$q$") == [ss.SET]


@pytest.mark.parametrize("sql", ["UPDATE t SET a = 1", "INSERT INTO t VALUES (1)", "BEGIN",
                                 "DELETE FROM t", "RELEASE SAVEPOINT s", "LOCK TABLE t",
                                 "CLUSTER t", "COMMIT", "SE",
                                 "END", "WITH x AS (SELECT 1) SELECT 2", "VALUES (1)",
                                 "TABLE t", "EXECUTE p", "FETCH c"])
def test_hot_path_skips_other_statements(sql: str) -> None:
    assert not candidate(sql.encode(), 0)


@pytest.mark.parametrize("sql", ["SET x=1", "select 1", "Listen c", "  LISTEN c", "-- c\nSET",
                                 "/* */SET", "(select 1)", "unlisten *", "create temp table",
                                 "DECLARE", "discard all", "load 'x'", "close all", "reset all"])
def test_hot_path_passes_candidates(sql: str) -> None:
    assert candidate(sql.encode(), 0)


_KEYWORD = st.sampled_from(["SET work_mem = 1", "LISTEN chan", "SELECT pg_advisory_lock(1)",
                            "CREATE TEMP TABLE t (a int)", "RESET ALL", "DISCARD ALL",
                            "LOAD 'x'", "UNLISTEN *"])
_COMMENT = st.one_of(
    st.text(st.characters(blacklist_characters="\n", codec="utf-8"), max_size=20).map(
        lambda t: f"-- {t}\n"),
    st.text(st.characters(codec="utf-8"), max_size=20).filter(
        lambda t: "*/" not in t and "/*" not in t).map(lambda t: f"/* {t} */"),
    st.sampled_from([" ", "\t", "\n", "\r\n", "/* a /* nested */ b */"]),
)


def _case(text: str, flips: list[bool]) -> str:
    flips = flips + [False] * len(text)
    return "".join(ch.swapcase() if flip else ch for ch, flip in zip(text, flips[: len(text)],
                                                                     strict=True))


@given(prefix=st.lists(_COMMENT, max_size=4), sql=_KEYWORD,
       flips=st.lists(st.booleans(), max_size=30))
def test_comments_and_case_do_not_change_the_verdict(prefix: list[str], sql: str,
                                                     flips: list[bool]) -> None:
    # Case of the keywords only (a channel or literal keeps its own).
    verb_end = sql.index(" ")
    cased = _case(sql[:verb_end], flips) + sql[verb_end:]
    text = ("".join(prefix) + cased).encode()
    assert candidate(text, 0)
    assert kinds(cased) == kinds(sql) != []
    assert [c.kind for c in classify(text)] == kinds(sql)


@given(value=st.text(st.characters(codec="utf-8", blacklist_characters="\x00"), max_size=30))
def test_set_config_value_is_quoted_safely(value: str) -> None:
    literal = "'" + value.replace("'", "''") + "'"
    found = classify(f"SELECT set_config('a.b', {literal}, false)".encode())
    assert [c.kind for c in found] == [ss.SET]
    replay = found[0].replay.decode()
    # The replay's literal reads back as the value: an E'' literal with quotes and
    # backslashes doubled, and nothing after it but the call's end.
    inner = replay[replay.index(", E'") + 4 : -len("', false)")]
    assert inner.replace("''", "'").replace("\\\\", "\\") == value


@given(literal=st.text(st.characters(codec="utf-8", blacklist_characters="\x00"), max_size=30))
def test_quotes_hide_semicolons(literal: str) -> None:
    quoted = "'" + literal.replace("'", "''") + "'"
    text = f"SET application_name = {quoted}".encode()
    first, alone = ss.single(text + b";", 0)
    assert alone and first == text


@pytest.mark.parametrize("reset", [Command(ss.RESET, b"search_path"), Command(ss.RESET_ALL),
                                   Command(ss.DISCARD_ALL)])
def test_a_reset_goes_back_to_the_startup_value(reset: Command) -> None:
    """PostgreSQL's RESET goes to the session's startup value: a search_path the startup
    packet set, which only the record follows, is made again, not dropped."""
    startup = ss.set_config_statement(b"search_path", b"pg_catalog, public")
    session = ss.ClientSession()
    session.started_with(b"search_path", startup)
    server: dict[bytes, bytes | None] = session.on_server()
    session.sent([Command(ss.SET, b"search_path", b"SET search_path = x"),
                  Command(ss.SET, b"a", b"SET a = 1")], server)
    session.ready(ord("I"), 0, server)
    assert session.sets == {b"search_path": b"SET search_path = x", b"a": b"SET a = 1"}
    session.sent([reset], server)
    session.ready(ord("I"), 0, server)
    kept = {} if reset.kind != ss.RESET else {b"a": b"SET a = 1"}
    assert session.sets == {**kept, b"search_path": startup}
    assert b"search_path" not in server  # the server has its own default: made at next link
    assert ss.sync_statements(server, session.sets).count(b"set_config") == 1
    # A client with no startup value has nothing to go back to.
    other = ss.ClientSession()
    other.sent([Command(ss.SET, b"search_path", b"SET search_path = x")], None)
    other.ready(ord("I"), 0, None)
    other.sent([reset], None)
    other.ready(ord("I"), 0, None)
    assert other.sets == {}


def test_a_client_record_follows_transactions() -> None:
    session = ss.ClientSession()
    server: dict[bytes, bytes | None] = {}
    set_a = Command(ss.SET, b"a", b"SET a = 1")
    session.sent([set_a], server)
    assert server == {b"a": None}
    session.ready(ord("T"), 0, server)
    assert session.sets == {}  # not over yet
    session.sent([Command(ss.ROLLBACK)], server)
    session.ready(ord("I"), 0, server)
    assert session.sets == {} and server == {b"a": None}
    session.sent([set_a], server)
    session.ready(ord("I"), 1, server)  # an error: rolled back
    assert session.sets == {}
    session.sent([set_a], server)
    session.ready(ord("I"), 1, server)
    assert session.sets == {b"a": b"SET a = 1"} and server == {b"a": b"SET a = 1"}
    session.sent([Command(ss.LISTEN, b"c"), Command(ss.LOCK), Command(ss.LOCK)], server)
    assert session.pinned() == "listen, advisory lock" and session.busy()
    session.ready(ord("I"), 2, server)  # failed: a pin is never given back on a guess
    assert session.pinned() == "listen, advisory lock"
    session.sent([Command(ss.UNLOCK), Command(ss.UNLISTEN_ALL)], server)
    session.ready(ord("I"), 2, server)
    assert session.pinned() == "advisory lock"
    session.sent([Command(ss.UNLOCK)], server)
    session.ready(ord("I"), 2, server)
    assert session.pinned() == "" and not session.busy()
    session.sent([Command(ss.DISCARD_ALL)], server)
    session.ready(ord("I"), 2, server)
    assert session.sets == {} and server == {}


def test_tracked_parameters_are_left_to_their_own_machinery() -> None:
    session = ss.ClientSession(frozenset({b"application_name"}))
    server: dict[bytes, bytes | None] = {}
    session.sent(classify(b"SET application_name = 'x'") + classify(b"SET a = 1"), server)
    session.ready(ord("I"), 0, server)
    assert session.sets == {b"a": b"SET a = 1"} and server == {b"a": b"SET a = 1"}


def test_sync_statements() -> None:
    client = {b"work_mem": b"SET work_mem = 1", ss.ROLE: b"SET ROLE r"}
    assert ss.sync_statements({}, {}) == b""
    assert ss.sync_statements(dict(client), client) == b""
    assert ss.sync_statements({b"search_path": None, ss.ROLE: b"SET ROLE q"}, client) == (
        b"RESET search_path;\nSET work_mem = 1;\nSET ROLE r")
    assert ss.sync_statements({b"x": b"SET x = 1", ss.ROLE: b"SET ROLE q"}, {}) == (
        b"RESET ROLE;\nRESET x")
    assert ss.undo(b"Odd Name") == b'RESET "Odd Name"'
