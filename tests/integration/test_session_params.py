"""Session parameters in transaction mode, against a real PostgreSQL: clients that share
one server each keep the client_encoding, DateStyle, TimeZone, IntervalStyle,
standard_conforming_strings and application_name they asked for (in the startup packet or
with SET), on every transaction, whoever used the server before (COMPAT.md).

Pools of size 1, with pg_backend_pid() checked, make sure the clients really share.
"""

from __future__ import annotations

import asyncpg
import psycopg
import pytest

from tests.integration.app_client import CONNECT_TIMEOUT, connect
from tests.integration.rawclient import RawClient

pytestmark = pytest.mark.timeout(30)

SETTINGS_SQL = (
    "SELECT current_setting('DateStyle'), current_setting('IntervalStyle'),"
    " current_setting('TimeZone'), current_setting('application_name'),"
    " current_setting('standard_conforming_strings'), pg_backend_pid()"
)


def server_defaults(postgres) -> tuple[str, str, str]:
    """DateStyle, IntervalStyle and TimeZone a plain connection to db app gets."""
    with psycopg.connect(postgres.dsn("app", "app", "app-secret")) as conn:
        row = conn.execute(
            "SELECT current_setting('DateStyle'), current_setting('IntervalStyle'),"
            " current_setting('TimeZone')"
        ).fetchone()
        assert row is not None
        return row[0], row[1], row[2]


def test_set_timezone_does_not_leak_to_the_next_client(postgres, pooler) -> None:
    _, _, default_tz = server_defaults(postgres)
    assert default_tz != "Asia/Tokyo"
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("SET TimeZone = 'Asia/Tokyo'")
        ts = "SELECT '2024-01-01 00:00:00+00'::timestamptz::text, pg_backend_pid()"
        for _ in range(3):
            text_a, pid_a = a.execute(ts).fetchone()
            text_b, pid_b = b.execute(ts).fetchone()
            assert pid_a == pid_b  # one server, taking turns
            assert text_a == "2024-01-01 09:00:00+09"
            assert b.execute("SHOW TimeZone").fetchone()[0] == default_tz
            assert a.execute("SHOW TimeZone").fetchone()[0] == "Asia/Tokyo"
        assert a.info.parameter_status("TimeZone") == "Asia/Tokyo"
        assert b.info.parameter_status("TimeZone") == default_tz


async def test_startup_parameters_are_honoured_on_every_transaction(postgres, pooler) -> None:
    datestyle, intervalstyle, tz = server_defaults(postgres)
    p = pooler(ini_overrides={"default_pool_size": "1"})
    a = await asyncpg.connect(
        p.dsn(), statement_cache_size=0, timeout=CONNECT_TIMEOUT,
        server_settings={
            "DateStyle": "German, DMY",
            "IntervalStyle": "sql_standard",
            "TimeZone": "Asia/Tokyo",
            "application_name": "client-a",
        },
    )
    b = await psycopg.AsyncConnection.connect(
        p.dsn(), autocommit=True, connect_timeout=CONNECT_TIMEOUT, application_name="client-b",
        prepare_threshold=None,
    )
    try:
        for _ in range(3):
            row_a = await a.fetchrow(SETTINGS_SQL)
            cur = await b.execute(SETTINGS_SQL)
            row_b = await cur.fetchone()
            assert row_a is not None and row_b is not None
            assert row_a[5] == row_b[5]  # the same server
            assert tuple(row_a[:5]) == ("German, DMY", "sql_standard", "Asia/Tokyo",
                                        "client-a", "on")
            assert tuple(row_b[:5]) == (datestyle, intervalstyle, tz, "client-b", "on")
            # ... and the values act, not just show.
            assert await a.fetchval("SELECT '2024-01-02'::date::text") == "02.01.2024"
            assert await a.fetchval("SELECT interval '1 day 2 hours'::text") == "1 2:00:00"
            cur = await b.execute("SELECT '2024-01-02'::date::text")
            assert (await cur.fetchone()) == ("2024-01-02",)
    finally:
        await a.close()
        await b.close()


def test_application_name_is_visible_in_pg_stat_activity(postgres, pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn(), application_name="first-app") as a:
        a.execute("SELECT 1")
        with connect(p.dsn(), application_name="second-app") as b:
            b.execute("BEGIN")
            pid = b.execute("SELECT pg_backend_pid()").fetchone()[0]
            rows = postgres.execute(
                "SELECT application_name FROM pg_stat_activity WHERE pid = %s", params=(pid,)
            )
            assert rows == [("second-app",)]
            b.execute("COMMIT")
        a.execute("BEGIN")
        assert a.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
        rows = postgres.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", params=(pid,)
        )
        assert rows == [("first-app",)]
        a.execute("COMMIT")


def test_standard_conforming_strings_per_client(pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("SET standard_conforming_strings = off")
        for _ in range(2):
            assert b.execute("SHOW standard_conforming_strings").fetchone()[0] == "on"
            assert a.execute("SHOW standard_conforming_strings").fetchone()[0] == "off"
            # With it off, a backslash in a plain literal is an escape.
            assert a.execute("SELECT length('a\\\\b')").fetchone()[0] == 3
            assert b.execute("SELECT length('a\\\\b')").fetchone()[0] == 4


def test_set_local_and_rolled_back_set_do_not_stick(postgres, pooler) -> None:
    _, _, default_tz = server_defaults(postgres)
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("BEGIN")
        a.execute("SET LOCAL TimeZone = 'Asia/Tokyo'")
        assert a.execute("SHOW TimeZone").fetchone()[0] == "Asia/Tokyo"
        a.execute("COMMIT")
        a.execute("BEGIN")
        a.execute("SET TimeZone = 'America/New_York'")
        a.execute("ROLLBACK")
        assert b.execute("SHOW TimeZone").fetchone()[0] == default_tz
        assert a.execute("SHOW TimeZone").fetchone()[0] == default_tz
        a.execute("SET TimeZone = 'Europe/Paris'")
        assert b.execute("SHOW TimeZone").fetchone()[0] == default_tz
        assert a.execute("SHOW TimeZone").fetchone()[0] == "Europe/Paris"


def test_client_encoding_per_client(pooler) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn()) as a, connect(p.dsn(), client_encoding="LATIN1") as b:
        for _ in range(2):
            assert b.execute("SHOW client_encoding").fetchone()[0] == "LATIN1"
            assert a.execute("SHOW client_encoding").fetchone()[0] == "UTF8"
            assert b.execute("SELECT 'café'").fetchone()[0] == "café"
            assert a.execute("SELECT 'café'").fetchone()[0] == "café"


def test_unsupported_startup_parameter(pooler) -> None:
    p = pooler()
    with pytest.raises(psycopg.OperationalError) as info:
        connect(p.dsn(), options="-c geqo=off")
    # options' settings are startup parameters of their own (PgBouncer 1.20+): geqo is not one
    assert "unsupported startup parameter in options: geqo" in str(info.value)
    p2 = pooler(ini_overrides={"ignore_startup_parameters": "options, extra_float_digits"})
    with connect(p2.dsn(), options="-c geqo=off") as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1


@pytest.mark.timeout(30)
def test_a_failed_hidden_set_runs_none_of_the_clients_requests(pooler, app_table) -> None:
    """A client whose TimeZone the server refuses: the pooler's SET fails, and the client's
    INSERT must not run under the server's own TimeZone. The client is dropped with the
    reason; the table stays empty; the next client is served."""
    p = pooler({"auth_type": "trust", "default_pool_size": "1"})
    with RawClient(p.host, p.port) as bad:
        login = bad.login("app", "app", TimeZone="Mars/Olympus_Mons")
        assert login.error is None, login.error  # checked when it lands on a server
        bad.query(f"INSERT INTO {app_table} VALUES (1)")
        fields = bad.read_error_and_close()
        assert fields["S"] == "FATAL"
        assert "could not set session parameters" in fields["M"], fields
        assert "Mars/Olympus_Mons" in fields["M"], fields
    with RawClient(p.host, p.port) as good:
        assert good.login("app", "app").error is None
        rows, _, _ = good.simple_query(f"SELECT count(*) FROM {app_table}")
        assert rows == [["0"]]


@pytest.mark.timeout(30)
def test_list_and_backslash_values_reach_the_server_as_sent(pooler) -> None:
    """Tracked values are set with set_config and literals that survive a backslash: an
    application_name with backslashes and quotes, and a list-valued tracked parameter
    (search_path through track_extra_parameters), arrive intact (SET would have made the
    list one quoted name)."""
    p = pooler({"auth_type": "trust", "default_pool_size": "1",
                "track_extra_parameters": "search_path"})
    name = "odd \\ name 'quoted' \\"
    with RawClient(p.host, p.port) as other, RawClient(p.host, p.port) as client:
        assert other.login("app", "app").error is None
        assert client.login("app", "app", application_name=name,
                            search_path='"$user", public, pg_catalog').error is None
        for _ in range(2):  # the two clients take turns on the one server
            rows, _, _ = client.simple_query(
                "SELECT current_setting('application_name'), current_setting('search_path')")
            assert rows == [[name, '"$user", public, pg_catalog']]
            rows, _, _ = other.simple_query("SELECT current_setting('application_name')")
            assert rows == [[""]]


def test_another_spelling_of_the_servers_value_is_set_once(pooler) -> None:
    """DateStyle ISO asked for, "ISO, MDY" kept by the server: one hidden SET, then the
    server's spelling is the client's and no second SET goes out. At debug level both are
    logged in PgBouncer's words (varcache_apply, varcache_set_canonical)."""
    p = pooler(ini_overrides={"verbose": "2", "default_pool_size": "1"})
    with connect(p.dsn(), options="-c DateStyle=ISO") as conn:
        for _ in range(3):
            assert conn.execute("SHOW DateStyle").fetchone()[0] == "ISO, MDY"
    log = p.log()
    assert log.count("varcache_apply: SET DateStyle='ISO'") == 1, log
    assert log.count("varcache_set_canonical: setting DateStyle to its canonical version "
                     "ISO -> ISO, MDY") == 1, log


# --- PgBouncer 1.26: the writable reported parameters, tracked by default ----------------
# PostgreSQL 14+ reports default_transaction_read_only; search_path only from 18. Where the
# server reports one it is tracked as a reported parameter; where it does not, a startup
# value of it follows its client through the session-state record (pooling/params.py).


def _server_reports(postgres, name: str) -> bool:
    with psycopg.connect(postgres.dsn("app", "app", "app-secret")) as conn:
        return conn.info.parameter_status(name) is not None


@pytest.mark.timeout(30)
def test_default_transaction_read_only_does_not_leak(postgres, pooler, app_table) -> None:
    """A client's SET default_transaction_read_only = on stays its own: the next client on
    the same server writes, and the first stays read-only on every transaction."""
    assert _server_reports(postgres, "default_transaction_read_only")
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn()) as a, connect(p.dsn()) as b:
        a.execute("SET default_transaction_read_only = on")
        for n in range(3):
            pid_a = a.execute("SELECT pg_backend_pid()").fetchone()[0]
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                a.execute(f"INSERT INTO {app_table} VALUES (0)")
            b.execute(f"INSERT INTO {app_table} VALUES ({n})")
            assert b.execute("SELECT pg_backend_pid()").fetchone()[0] == pid_a
            assert b.execute("SHOW default_transaction_read_only").fetchone()[0] == "off"
            assert a.execute("SHOW default_transaction_read_only").fetchone()[0] == "on"
        assert a.info.parameter_status("default_transaction_read_only") == "on"
        assert b.info.parameter_status("default_transaction_read_only") == "off"
        assert b.execute(f"SELECT count(*) FROM {app_table}").fetchone()[0] == 3


@pytest.mark.timeout(30)
def test_startup_default_transaction_read_only_is_tracked(postgres, pooler) -> None:
    """In the startup packet (options -c), as PgBouncer 1.26 takes it by default."""
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn(), options="-c default_transaction_read_only=on") as a, \
            connect(p.dsn()) as b:
        for _ in range(2):
            assert a.execute("SHOW default_transaction_read_only").fetchone()[0] == "on"
            assert b.execute("SHOW default_transaction_read_only").fetchone()[0] == "off"
        assert a.info.parameter_status("default_transaction_read_only") == "on"


@pytest.mark.timeout(30)
def test_startup_search_path_follows_its_client(postgres, pooler) -> None:
    """search_path in the startup packet, where the server does not report it (before
    PostgreSQL 18): the client has it on every transaction, the next client on the same
    server has the default, and no ParameterStatus claims a value the server never sent."""
    with psycopg.connect(postgres.dsn("app", "app", "app-secret")) as direct:
        default = direct.execute("SHOW search_path").fetchone()[0]
        reported = direct.info.parameter_status("search_path") is not None
    with psycopg.connect(postgres.dsn("app", "app", "app-secret"),
                         options="-c search_path=pg_catalog,public") as direct:
        asked = direct.execute("SHOW search_path").fetchone()[0]  # as PostgreSQL shows it
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn(), options="-c search_path=pg_catalog,public") as a, \
            connect(p.dsn()) as b:
        for _ in range(3):
            pid_a = a.execute("SELECT pg_backend_pid()").fetchone()[0]
            assert a.execute("SHOW search_path").fetchone()[0] == asked
            assert b.execute("SHOW search_path").fetchone()[0] == default
            assert b.execute("SELECT pg_backend_pid()").fetchone()[0] == pid_a
        if not reported:
            assert a.info.parameter_status("search_path") is None
        a.execute("SET search_path = public")  # the client's own SET replaces it
        assert a.execute("SHOW search_path").fetchone()[0] == "public"
        assert b.execute("SHOW search_path").fetchone()[0] == default
        assert a.execute("SHOW search_path").fetchone()[0] == "public"


@pytest.mark.timeout(30)
def test_reset_goes_back_to_the_startup_search_path(postgres, pooler) -> None:
    """RESET search_path (and RESET ALL) goes back to the value the startup packet set, as on
    a direct connection, from the next transaction on, where the server does not report
    search_path; the next client on that server still has its own."""
    with psycopg.connect(postgres.dsn("app", "app", "app-secret")) as direct:
        default = direct.execute("SHOW search_path").fetchone()[0]
        if direct.info.parameter_status("search_path") is not None:
            pytest.skip("this PostgreSQL reports search_path: it follows as a parameter")
    options = "-c search_path=pg_catalog,public"
    with psycopg.connect(postgres.dsn("app", "app", "app-secret"), options=options,
                         autocommit=True) as direct:
        asked = direct.execute("SHOW search_path").fetchone()[0]
        direct.execute("SET search_path = public")
        direct.execute("RESET search_path")
        assert direct.execute("SHOW search_path").fetchone()[0] == asked
    p = pooler(ini_overrides={"default_pool_size": "1"})
    with connect(p.dsn(), options=options) as a, connect(p.dsn()) as b:
        for reset in ("RESET search_path", "RESET ALL", "DISCARD ALL"):
            a.execute("SET search_path = public")
            assert a.execute("SHOW search_path").fetchone()[0] == "public"
            a.execute(reset)
            assert a.execute("SHOW search_path").fetchone()[0] == asked, reset
            assert b.execute("SHOW search_path").fetchone()[0] == default
            assert a.execute("SHOW search_path").fetchone()[0] == asked


@pytest.mark.timeout(30)
def test_startup_search_path_where_no_record_follows(postgres, pooler) -> None:
    """Session mode (or session_state = ignore) keeps no record: an unreported search_path
    in the startup packet is refused as before, or dropped when ignore_startup_parameters
    lists it; reported, it would be tracked."""
    with psycopg.connect(postgres.dsn("app", "app", "app-secret")) as direct:
        if direct.info.parameter_status("search_path") is not None:
            pytest.skip("this PostgreSQL reports search_path: it is tracked")
    p = pooler(ini_overrides={"session_state": "ignore"})
    with pytest.raises(psycopg.OperationalError) as info:
        connect(p.dsn(), options="-c search_path=public")
    assert "unsupported startup parameter: search_path" in str(info.value)
    p2 = pooler(ini_overrides={"session_state": "ignore",
                               "ignore_startup_parameters": "search_path"})
    with connect(p2.dsn(), options="-c search_path=pg_catalog") as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1
