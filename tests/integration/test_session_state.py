"""Session state in transaction mode, against a real PostgreSQL (docs/session-state.md): what
a client changes follows it and never reaches another client, compared with what direct
connections give; each session_state policy; the SHOW CLIENTS column and the counters.

A pool of one server makes sure the second client lands on the first one's server (its
pg_backend_pid() is checked); a client pinned to its server needs a pool of two for the
other client to run meanwhile.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from typing import Any

import psycopg
import pytest

from pypool.embedded import free_port
from pypool.protocol import messages as m
from tests.integration.app_client import connect
from tests.integration.rawclient import RawClient

pytestmark = pytest.mark.timeout(60)

OTHER_ROLE = "session_state_other"


def one(conn: psycopg.Connection[Any], sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def pid(conn: psycopg.Connection[Any]) -> int:
    return int(one(conn, "SELECT pg_backend_pid()"))


def direct(postgres: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(postgres.dsn("app", "app", "app-secret"), autocommit=True)


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(rf'^pypool_{name}_total{{[^}}]*database="app"'
                                            rf"[^}}]*}} (\S+)$", text, re.M))


def pinned_column(p: Any) -> list[str]:
    with psycopg.connect(p.dsn("pgbouncer", "pool_admin", "admin-secret"),
                         autocommit=True) as admin:
        cur = admin.execute("SHOW CLIENTS")
        names = [c.name for c in cur.description or []]
        return [row[names.index("pinned")] for row in cur.fetchall()
                if row[names.index("database")] == "app"]


# --- settings follow their client ------------------------------------------------------------

def test_set_follows_its_client_and_never_reaches_another(postgres, pooler) -> None:
    with direct(postgres) as plain:
        default_timeout = one(plain, "SHOW statement_timeout")
        default_path = one(plain, "SHOW search_path")
        plain.execute("SET statement_timeout = '4321ms'")
        plain.execute("SET search_path = pg_catalog, public")
        plain.execute("SELECT set_config('myapp.user_id', '7', false)")
        expected = (one(plain, "SHOW statement_timeout"), one(plain, "SHOW search_path"),
                    one(plain, "SELECT current_setting('myapp.user_id')"))
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("SET statement_timeout = '4321ms'")
        a.execute("SET search_path = pg_catalog, public")
        a.execute("SELECT set_config('myapp.user_id', '7', false)")
        for _ in range(3):
            assert pid(a) == pid(b)  # one server, taking turns
            assert (one(a, "SHOW statement_timeout"), one(a, "SHOW search_path"),
                    one(a, "SELECT current_setting('myapp.user_id')")) == expected
            assert one(b, "SHOW statement_timeout") == default_timeout
            assert one(b, "SHOW search_path") == default_path
            assert one(b, "SELECT current_setting('myapp.user_id', true)") in (None, "")
        # RESET of one, then RESET ALL: the record follows
        a.execute("RESET statement_timeout")
        one(b, "SELECT 1")
        assert one(a, "SHOW statement_timeout") == default_timeout
        assert one(a, "SHOW search_path") == expected[1]
        a.execute("RESET ALL")
        one(b, "SELECT 1")
        assert one(a, "SHOW search_path") == default_path


def test_a_list_of_sets_follows_and_tracked_parameters_keep_their_own(pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn(), application_name="b_app") as b, connect(p.dsn()) as a:
        a.execute("SET work_mem = '3MB'; SET application_name = 'a_app'; SET lock_timeout = 7")
        for _ in range(2):
            assert pid(a) == pid(b)
            assert one(b, "SHOW application_name") == "b_app"
            assert one(b, "SHOW lock_timeout") == "0"
            assert (one(a, "SHOW work_mem"), one(a, "SHOW application_name"),
                    one(a, "SHOW lock_timeout")) == ("3MB", "a_app", "7ms")
        assert pinned_column(p) == ["", ""]


def test_settings_are_made_only_where_the_server_differs(pooler) -> None:
    metrics = free_port()
    p = pooler(ini_overrides={"default_pool_size": "1", "metrics_port": str(metrics)})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("SET work_mem = '3MB'")
        for _ in range(5):  # alone on its server: nothing to make or undo
            assert one(a, "SHOW work_mem") == "3MB"
        assert metric(metrics, "session_synced_links") == 0
        one(b, "SELECT 1")  # b's link undoes a's setting
        assert one(a, "SHOW work_mem") == "3MB"  # a's link makes it again
        assert metric(metrics, "session_synced_links") == 2
        for _ in range(3):
            one(b, "SELECT 1")  # the server holds nobody's settings: nothing sent
        assert metric(metrics, "session_synced_links") == 3  # only the first undid a's


def test_rolled_back_and_local_sets_are_not_kept(postgres, pooler) -> None:
    with direct(postgres) as plain:
        default = one(plain, "SHOW work_mem")
        with plain.transaction(force_rollback=True):
            plain.execute("SET work_mem = '7MB'")
        plain.execute("BEGIN")
        plain.execute("SET LOCAL work_mem = '9MB'")
        plain.execute("COMMIT")
        assert one(plain, "SHOW work_mem") == default
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("BEGIN")
        a.execute("SET work_mem = '7MB'")
        a.execute("ROLLBACK")
        a.execute("BEGIN")
        a.execute("SET LOCAL work_mem = '9MB'")
        a.execute("COMMIT")
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            a.execute("SET work_mem = 'lots'")  # fails: nothing to record
        assert one(b, "SHOW work_mem") == default
        assert one(a, "SHOW work_mem") == default
        # committed inside a block: kept
        a.execute("BEGIN")
        a.execute("SET work_mem = '5MB'")
        a.execute("COMMIT")
        assert one(b, "SHOW work_mem") == default
        assert one(a, "SHOW work_mem") == "5MB"


def test_set_role_follows_its_client(postgres, pooler) -> None:
    postgres.execute(f"DROP ROLE IF EXISTS {OTHER_ROLE}")
    postgres.execute(f"CREATE ROLE {OTHER_ROLE} NOLOGIN")
    postgres.execute(f"GRANT {OTHER_ROLE} TO app")
    with direct(postgres) as plain:
        plain.execute(f"SET ROLE {OTHER_ROLE}")
        assert one(plain, "SELECT current_user") == OTHER_ROLE
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute(f"SET ROLE {OTHER_ROLE}")
        for _ in range(2):
            assert pid(a) == pid(b)
            assert one(b, "SELECT current_user") == "app"  # never another's privileges
            assert one(a, "SELECT current_user") == OTHER_ROLE
        a.execute("RESET ROLE")
        assert one(a, "SELECT current_user") == "app"


def test_set_session_authorization_follows_its_client(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})
    admin = p.dsn("app", "pool_admin", "admin-secret")
    with connect(admin) as a, connect(admin) as b:
        a.execute("SET SESSION AUTHORIZATION app")
        assert one(a, "SELECT session_user") == "app"
        assert pid(a) == pid(b)
        assert one(b, "SELECT session_user") == "pool_admin"
        assert one(a, "SELECT session_user") == "app"


def test_ignore_leaks_as_pgbouncer_does(pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1", "session_state": "ignore"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("SET statement_timeout = '4321ms'")
        assert pid(a) == pid(b)
        assert one(b, "SHOW statement_timeout") == "4321ms"


# --- state that pins its client --------------------------------------------------------------

def test_listen_pins_and_notifications_reach_the_listener_only(postgres, pooler) -> None:
    metrics = free_port()
    # listen_mode = pin: the default, shared, pins nothing (tests/integration/test_listen_shared)
    p = pooler(ini_overrides={"default_pool_size": "2", "metrics_port": str(metrics),
                              "listen_mode": "pin"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        notices: list[str] = []
        a.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        a.execute("LISTEN session_state_chan")
        server = pid(a)
        assert any("keeps its server" in n for n in notices)
        assert "listen" in pinned_column(p)
        assert metric(metrics, "session_pinned_clients") == 1
        for _ in range(3):
            assert pid(b) != server
            assert pid(a) == server
        with direct(postgres) as plain:
            plain.execute("NOTIFY session_state_chan, 'hello'")
        a.execute("SELECT 1")
        assert [n.payload for n in a.notifies(timeout=2, stop_after=1)] == ["hello"]
        assert list(b.notifies(timeout=0.2)) == []
        a.execute("UNLISTEN *")
        assert pinned_column(p) == ["", ""]


def test_advisory_lock_pins_until_unlocked(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "2"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        assert one(a, "SELECT pg_advisory_lock(4711)") == ""
        assert one(b, "SELECT pg_try_advisory_lock(4711)") is False  # as another session
        assert one(a, "SELECT pg_advisory_unlock(4711)") is True  # on the locking session
        # a unpinned; b too, once its (failed, but counted: when unsure, pin) try is undone
        assert sorted(pinned_column(p)) == ["", "advisory lock"]
        assert one(b, "SELECT pg_advisory_unlock_all()") == ""
        assert pinned_column(p) == ["", ""]
        assert one(b, "SELECT pg_try_advisory_lock(4711)") is True


def test_temp_table_and_hold_cursor_pin(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "2"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("CREATE TEMP TABLE session_state_t (a int)")
        a.execute("INSERT INTO session_state_t VALUES (1), (2)")
        a.execute("DECLARE session_state_c CURSOR WITH HOLD FOR SELECT generate_series(1, 3)")
        assert one(a, "FETCH 1 FROM session_state_c") == 1
        for _ in range(2):
            with pytest.raises(psycopg.errors.UndefinedTable):
                b.execute("SELECT * FROM pg_temp.session_state_t")
            with pytest.raises(psycopg.errors.InvalidCursorName):
                b.execute("FETCH 1 FROM session_state_c")
        assert one(a, "SELECT count(*) FROM session_state_t") == 2
        assert one(a, "FETCH 1 FROM session_state_c") == 2
        assert pinned_column(p)[0] in ("temp table, with hold cursor", "")
        assert "temp table, with hold cursor" in pinned_column(p)
        a.execute("CLOSE ALL")
        assert "temp table" in pinned_column(p)
        a.execute("DISCARD TEMP")
        assert pinned_column(p) == ["", ""]


def test_a_pinned_client_that_leaves_leaves_nothing(postgres, pooler, pg_activity) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn()) as a:
        a.execute("LISTEN session_state_gone")
        a.execute("SELECT pg_advisory_lock(99)")
        a.execute("CREATE TEMP TABLE session_state_gone (a int)")
        server = pid(a)
    with connect(p.dsn()) as b:
        assert pid(b) == server  # the same server, reset
        assert one(b, "SELECT count(*) FROM pg_listening_channels()") == 0
        assert one(b, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                      "AND pid = pg_backend_pid()") == 0
        assert one(b, "SELECT to_regclass('pg_temp.session_state_gone')") is None


def test_load_pins_and_closes_the_server_after(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})
    admin = p.dsn("app", "pool_admin", "admin-secret")
    with connect(admin) as a:
        a.execute("LOAD 'auto_explain'")
        server = pid(a)
        assert one(a, "SHOW auto_explain.log_min_duration") == "-1"
    deadline = time.monotonic() + 5
    with connect(admin) as b:
        while pid(b) == server and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid(b) != server  # a LOADed library stays loaded: that server was closed


# --- reject ----------------------------------------------------------------------------------

@pytest.mark.parametrize("sql", ["LISTEN x", "SET work_mem = '5MB'", "SET ROLE app",
                                 "SELECT pg_advisory_lock(1)", "CREATE TEMP TABLE t (a int)",
                                 "SELECT set_config('work_mem', '5MB', false)"])
def test_reject_answers_0a000_and_the_client_stays(pooler, sql: str) -> None:
    metrics = free_port()
    p = pooler(ini_overrides={"session_state": "reject", "metrics_port": str(metrics)})
    with connect(p.dsn()) as a:
        with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
            a.execute(sql)
        assert "transaction pooling mode" in str(refused.value)
        assert refused.value.sqlstate == "0A000"
        assert one(a, "SELECT 1") == 1
        assert one(a, "SELECT count(*) FROM pg_listening_channels()") == 0
        assert one(a, "SHOW work_mem") != "5MB"
        assert one(a, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
        assert metric(metrics, "session_refused_statements") == 1
        # a named Parse too (the extended protocol; no parameters: the simple one above)
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            a.execute(sql, prepare=True)
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            a.execute(sql, prepare=True)  # the client's statement stays refused
        assert one(a, "SELECT 1") == 1
        # inside a block, the refusal aborts it as an error would
        a.execute("BEGIN")
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            a.execute(sql)
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            a.execute("SELECT 1")
        a.execute("ROLLBACK")
        assert one(a, "SELECT 1") == 1


def test_reject_per_database(postgres, pooler) -> None:
    server = f"host={postgres.host} port={postgres.port} dbname=app"
    p = pooler(databases={"app": f"{server} session_state=reject", "bench": server})
    with connect(p.dsn()) as a:
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            a.execute("LISTEN x")


# --- pipelining ------------------------------------------------------------------------------

def test_a_lock_taker_is_never_a_neutral_pipeline_head(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1", "pipeline_depth": "4"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("SELECT pg_advisory_lock(8080)")
        outcome: list[Any] = []

        def other() -> None:
            outcome.append(one(b, "SELECT pg_advisory_unlock(8080)"))

        thread = threading.Thread(target=other)
        thread.start()
        time.sleep(0.5)
        assert outcome == []  # waits: the only server is pinned to a
        assert one(a, "SELECT pg_advisory_unlock(8080)") is True
        thread.join(10)
        assert outcome == [False]  # ran on no session holding the lock


def test_a_prepare_behind_another_statement_stays_its_client_s(postgres, pooler) -> None:
    """`SELECT 1; PREPARE p ...` in one Query: the statement exists only where its client is.
    Under PgBouncer (and with session_state = ignore) the next client on that server could
    EXECUTE it; here its client keeps the server, and the server is reset when it leaves."""
    p = pooler(ini_overrides={"default_pool_size": "2"})
    with connect(p.dsn()) as b:
        with connect(p.dsn()) as a:
            a.execute("SELECT 1; PREPARE stray_plan AS SELECT 42")
            server = pid(a)
            assert "untracked state" in pinned_column(p)
            for _ in range(3):
                assert pid(b) != server
                with pytest.raises(psycopg.errors.InvalidSqlStatementName):
                    b.execute("EXECUTE stray_plan")
                assert one(a, "EXECUTE stray_plan") == 42
                assert pid(a) == server
        # a left: its server was reset before serving anyone again.
        for _ in range(4):
            with pytest.raises(psycopg.errors.InvalidSqlStatementName):
                b.execute("EXECUTE stray_plan")
    with direct(postgres) as plain:
        rows = plain.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = 'app' "
                             "AND query ILIKE '%stray_plan%' AND pid <> pg_backend_pid() "
                             "AND state = 'idle in transaction'").fetchone()
        assert rows == (0,)


def test_a_query_postgresql_refuses_whole_leaves_nothing_to_undo(pooler) -> None:
    """A Query whose text is `SET`, a NUL and more: PostgreSQL refuses the message (08P01)
    and runs nothing. The next client on that server (a pool of one) is served as usual,
    never sent a RESET made from those bytes (which PostgreSQL refused too: that client was
    dropped)."""
    p = pooler(ini_overrides={"auth_type": "trust", "default_pool_size": "1"})
    with RawClient(p.host, p.port) as raw:
        assert raw.login("app", "app").error is None
        raw.send(m.message(m.QUERY, b"SET\x00\x00"))
        answer = raw.read_until(m.READY_FOR_QUERY)
        errors = [m.parse_error_fields(body) for kind, body in answer
                  if kind == m.ERROR_RESPONSE]
        assert [e["C"] for e in errors] == ["08P01"], errors
    with connect(p.dsn()) as other:
        assert one(other, "SELECT 42") == 42


def test_a_waiting_client_s_statements_survive_a_pinned_client_s_discard_all(pooler) -> None:
    """A pinned client (an advisory lock) leaves while another waits for the pool's one
    server: the pooler sends DISCARD ALL and hands the server on at once. The waiting
    client's prepared statement, rewritten then, runs after the DISCARD ALL on the server:
    it must be prepared there again (it was sent as still there, and failed with 26000)."""
    p = pooler(ini_overrides={"default_pool_size": "1", "max_prepared_statements": "20"})
    with psycopg.connect(p.dsn(), autocommit=True, prepare_threshold=0,
                         connect_timeout=10) as waiting, connect(p.dsn()) as pinned:
        assert one(waiting, "SELECT 1 + 1") == 2  # prepared (named) on the one server
        one(pinned, "SELECT pg_advisory_lock(4242)")  # pinned: it keeps that server
        outcome: list[Any] = []

        def again() -> None:
            try:
                outcome.append(one(waiting, "SELECT 1 + 1"))
            except psycopg.Error as exc:
                outcome.append(exc)

        thread = threading.Thread(target=again, daemon=True)
        thread.start()
        time.sleep(0.5)
        assert not outcome, "it waits for the pinned client's server"
        pinned.close()
        thread.join(10)
    assert outcome == [2]
