"""The pooler's own queries (server_check_query, the SET of a client's session parameters)
against a real PostgreSQL, when the client they run for goes away before they are answered.

Their replies are the backend ledger's (core/backend.py), never a client's: a client that
leaves under them must not have its requests run, and the server must not serve the next
client with those replies still to come.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from pypool.embedded import EmbeddedPostgres
from tests.conftest import rows_in
from tests.integration.app_client import connect
from tests.integration.polling import wait_for
from tests.integration.rawclient import RawClient

pytestmark = pytest.mark.timeout(40)

SLOW_CHECK = {
    "auth_type": "trust",
    "default_pool_size": "1",
    "server_check_query": "select pg_sleep(1)",
    "server_check_delay": "0",
}


def _warm_up(p) -> None:
    """Let the pool's one server serve a client: only a used server is checked (as in
    PgBouncer: one fresh from its login goes straight to its client)."""
    with RawClient(p.host, p.port) as first:
        assert first.login("app", "app").error is None
        assert first.simple_query("SELECT 1")[0] == [["1"]]


@pytest.mark.parametrize("own_timezone", [False, True])
def test_a_client_that_leaves_during_its_check_and_set_runs_nothing_and_leaks_nothing(
    pooler, postgres: EmbeddedPostgres, app_table: str, own_timezone: bool,
    pg_activity: Callable[..., int],
) -> None:
    """A client sends an INSERT; its server first runs server_check_query (1 s) and, with a
    TimeZone of its own, a SET; the client leaves during the check. The INSERT never runs,
    and the next client on the pool gets its own answers and its own TimeZone."""
    p = pooler(ini_overrides=SLOW_CHECK)
    _warm_up(p)
    params = {"TimeZone": "Asia/Tokyo"} if own_timezone else {}
    with RawClient(p.host, p.port) as leaving:
        login = leaving.login("app", "app", **params)
        assert login.error is None, login.error
        leaving.query(f"INSERT INTO {app_table} VALUES (1)")
        time.sleep(0.3)  # the check is running on the server
    with RawClient(p.host, p.port) as nxt:
        login = nxt.login("app", "app", TimeZone="UTC")
        assert login.error is None, login.error
        rows, _, status = nxt.simple_query("SELECT 'next', current_setting('TimeZone')")
        assert rows == [["next", "UTC"]]
        assert status == ord("I")
    with connect(p.dsn()) as conn:
        assert conn.execute("SELECT 2").fetchone() == (2,)
    time.sleep(1.2)  # anything left on the old server would have run by now
    assert rows_in(postgres, app_table) == 0
    assert wait_for(lambda: pg_activity(postgres) <= 1, 5)


def test_a_failing_check_gives_the_client_another_server_and_runs_its_query_once(
    pooler, postgres: EmbeddedPostgres, app_table: str,
) -> None:
    """server_check_query fails: the used server is closed, none of the client's requests
    sent to it, and a fresh server (not checked, as in PgBouncer) runs its INSERT once."""
    p = pooler(ini_overrides={**SLOW_CHECK, "server_check_query": "select 1/0"})
    _warm_up(p)
    with RawClient(p.host, p.port) as client:
        login = client.login("app", "app")
        assert login.error is None, login.error
        _, tag, status = client.simple_query(f"INSERT INTO {app_table} VALUES (1)")
        assert (tag, status) == ("INSERT 0 1", ord("I"))
    assert rows_in(postgres, app_table) == 1
    assert "server_check_query failed" in p.log()
