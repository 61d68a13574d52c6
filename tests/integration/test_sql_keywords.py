"""The SQL texts the pooler classifies, against what PostgreSQL itself does with them.

The pooler reads the first words of a simple Query to follow SQL-level prepared statements
(`PREPARE`, `EXECUTE`, `DEALLOCATE`, `DISCARD`: pooling/prepared/sql.py) and session state
(`SET`, `RESET`, `DISCARD`, `LISTEN`, `UNLISTEN`: pooling/session_state/). A statement that
merely begins with the same word (`PREPARE TRANSACTION 'gid'`, `SET TIME ZONE`, `RESET
TRANSACTION ISOLATION LEVEL`) must not be taken for another: that class of mistake lost data
once (test_two_phase.py).

Every keyword of the grammar (`pg_get_keywords()`) is put after every classified verb, with
the tails the grammar gives those verbs; each text runs on a direct connection, and what
PostgreSQL did (the prepared statements, session settings and channels it then has) is
compared with what the classifier said.
"""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pypool.pooling import session_state as ss
from pypool.pooling.prepared.sql import parse_sql_command

pytestmark = pytest.mark.timeout(300)

PREPARE_TAILS = ("AS SELECT 1", "(int) AS SELECT $1", "'gid'", "", "AS", "(int)")
SET_TAILS = ("TO DEFAULT", "= 'on'", "TO 'x'", "'UTC'", "ZONE 'UTC'", "ZONE LOCAL",
             "ISOLATION LEVEL SERIALIZABLE", "OPTION CONTENT", "app", "SESSION AUTHORIZATION",
             "ROLE app", "TIME ZONE 'UTC'", "AUTHORIZATION app", "CHARACTERISTICS AS "
             "TRANSACTION READ ONLY", "TO 'public'", "")


def _query(text: str) -> bytes:
    data = text.encode()
    return b"Q" + (len(data) + 5).to_bytes(4, "big") + data + b"\x00"


def _classify(text: str) -> list[ss.Command]:
    """What the session-state hot path and classifier say of the Query `text`."""
    message = _query(text)
    return ss.look(81, message, 0, len(message)) or []


@pytest.fixture(scope="module")
def direct(postgres):
    with psycopg.connect(postgres.dsn(dbname="app", user="app", password="app-secret"),
                         autocommit=True, connect_timeout=10) as conn:
        conn.prepare_threshold = None  # psycopg's own prepared statements would count too
        yield conn


@pytest.fixture(scope="module")
def keywords(direct) -> list[str]:
    words = [row[0] for row in direct.execute("SELECT word FROM pg_get_keywords()")]
    assert len(words) > 400 and "transaction" in words
    return words


def _run(conn, text: str) -> bool:
    try:
        conn.execute(text)
        return True
    except psycopg.Error:
        return False


def _statements(conn) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM pg_prepared_statements")}


def _session(conn) -> dict[str, str]:
    """The session's settings that differ from what RESET would make them, and who it is."""
    rows = conn.execute(
        "SELECT name, setting FROM pg_settings WHERE setting IS DISTINCT FROM reset_val "
        "UNION ALL SELECT '(role)', current_user UNION ALL SELECT '(session)', session_user"
    ).fetchall()
    return {name.lower(): value for name, value in rows}


def _reset_session(conn) -> None:
    for text in ("RESET SESSION AUTHORIZATION", "RESET ROLE", "RESET ALL", "UNLISTEN *",
                 "DEALLOCATE ALL"):
        conn.execute(text)


def _check_prepared(conn, text: str) -> None:
    """After `text` ran directly, the statements PostgreSQL holds are the ones the pooler
    believes: a PREPARE of name N made exactly N, nothing else made one."""
    conn.execute("DEALLOCATE ALL")
    conn.execute('PREPARE "existing" AS SELECT 1')
    before = _statements(conn)
    ok = _run(conn, text)
    after = _statements(conn)
    command = parse_sql_command(text.encode())
    if not ok:
        assert after == before, text
        return
    if command is None or command.verb == b"execute":
        assert after == before, (text, command and command.verb)
    elif command.verb == b"prepare":
        assert after == before | {command.name.decode()}, text
    elif command.verb == b"deallocate":
        gone = before - after
        assert gone == (before if not command.name else {command.name.decode()}), text
    else:  # discard
        assert after <= before, text


def test_every_keyword_after_prepare_is_classified_as_postgresql_runs_it(direct, keywords):
    for word in keywords:
        for tail in PREPARE_TAILS:
            _check_prepared(direct, f"PREPARE {word} {tail}")
    direct.execute("DEALLOCATE ALL")


def test_every_keyword_after_execute_and_deallocate(direct, keywords):
    for word in keywords:
        for verb in ("EXECUTE", "DEALLOCATE", "DEALLOCATE PREPARE", "DISCARD"):
            direct.execute("DEALLOCATE ALL")
            # A statement under the keyword's own name, so EXECUTE/DEALLOCATE of it can run.
            direct.execute(f'PREPARE "{word}" AS SELECT 1')
            before = _statements(direct)
            text = f"{verb} {word}"
            ok = _run(direct, text)
            command = parse_sql_command(text.encode())
            if ok and verb == "EXECUTE":
                assert command is not None and command.verb == b"execute", text
                assert command.name == word.encode(), text
            if ok and verb.startswith("DEALLOCATE"):
                assert command is not None and command.verb == b"deallocate", text
                gone = before - _statements(direct)
                assert gone == (before if not command.name else {command.name.decode()}), text
    direct.execute("DEALLOCATE ALL")


def _check_session(conn, base: dict[str, str], text: str) -> None:
    """After `text` ran directly, the session settings that changed are the ones the pooler
    records, its replay makes the same state on a fresh session, and its undo takes it back.
    The session is at its reset state before and after (a failed statement changes nothing)."""
    if not _run(conn, text):
        return
    after = _session(conn)
    channels = {row[0] for row in conn.execute("SELECT pg_listening_channels()")}
    commands = _classify(text)
    kinds = {c.kind for c in commands}
    changed = {name for name in set(base) | set(after) if base.get(name) != after.get(name)}
    try:
        if ss.UNTRACKABLE in kinds:
            return  # pinned: nothing is moved between servers
        if channels:
            assert ss.LISTEN in kinds, text  # a listener must keep its server
        sets = [c for c in commands if c.kind == ss.SET]
        if not sets:
            assert not changed, (text, commands)
            return
        assert len(sets) == 1, text
        name = sets[0].name.decode()
        # The record's name is what changed (the identity under its own names too).
        names = {"role": {"role", "(role)"}, "session_authorization": {
            "session_authorization", "(role)", "(session)"}}.get(name, {name})
        assert changed <= names, (text, name, changed)
        # The replay makes the same state on a fresh session; the undo takes it back.
        _reset_session(conn)
        conn.execute(sets[0].replay.decode())
        assert _session(conn) == after, (text, sets[0].replay)
        conn.execute(ss.undo(sets[0].name).decode())
        assert _session(conn) == base, (text, ss.undo(sets[0].name))
    finally:
        if changed or channels:
            _reset_session(conn)


@pytest.fixture(scope="module")
def base(direct) -> dict[str, str]:
    """The session as RESET leaves it: what every statement is compared against."""
    _reset_session(direct)
    return _session(direct)


def _check_reset(conn, word: str) -> None:
    """`RESET word` run directly after a SET of the same form: what the classifier says it
    resets is what PostgreSQL reset."""
    for tail in ("TO DEFAULT", "TO 'x'", "ZONE 'UTC'", "'UTC'"):
        _reset_session(conn)
        base = _session(conn)
        if not _run(conn, f"SET {word} {tail}"):
            continue
        made = _session(conn)
        text = f"RESET {word}" if tail != "ZONE 'UTC'" else f"RESET {word} ZONE"
        if not _run(conn, text):
            continue
        after = _session(conn)
        reset = {n for n in made if made.get(n) != after.get(n)}
        commands = _classify(text)
        if not reset:
            continue
        assert after == base, text
        kinds = {c.kind for c in commands}
        if ss.RESET_ALL in kinds:
            continue
        assert [c.kind for c in commands] == [ss.RESET], (text, commands)
        named = commands[0].name.decode()
        assert reset <= {named, "(role)", "(session)"}, (text, named, reset)


def test_every_keyword_after_set_is_followed_as_postgresql_runs_it(direct, keywords, base):
    for word in keywords:
        for tail in SET_TAILS:
            _check_session(direct, base, f"SET {word} {tail}")
            _check_session(direct, base, f"SET SESSION {word} {tail}")
    _reset_session(direct)


def test_every_keyword_after_reset_names_what_postgresql_resets(direct, keywords):
    for word in [*keywords, "timezone", "search_path", "application_name"]:
        _check_reset(direct, word)
    _reset_session(direct)


def test_every_keyword_after_listen_discard_and_unlisten(direct, keywords, base):
    for word in keywords:
        for verb in ("LISTEN", "UNLISTEN", "DISCARD"):
            _check_session(direct, base, f"{verb} {word}")
    _reset_session(direct)


# Case, comments and spacing the grammar allows between the words.
_SPACING = st.sampled_from([" ", "  ", "\n", "\t", " /* c */ ", " -- c\n", "/**/"])


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_spellings_of_the_classified_verbs(direct, keywords, base, data):
    verb = data.draw(st.sampled_from(["PREPARE", "prepare", "Prepare", "EXECUTE",
                                      "DEALLOCATE", "SET", "set", "RESET", "DISCARD",
                                      "LISTEN"]))
    word = data.draw(st.sampled_from([*keywords[::7], "transaction", "time", "all",
                                      "session", "local", "prepare"]))
    word = data.draw(st.sampled_from([word, word.upper(), word.capitalize()]))
    tail = data.draw(st.sampled_from(PREPARE_TAILS + SET_TAILS))
    text = verb + data.draw(_SPACING) + word + data.draw(_SPACING) + tail
    if verb.upper() in ("PREPARE", "EXECUTE", "DEALLOCATE"):
        _check_prepared(direct, text)
    else:
        _check_session(direct, base, text)
