"""max_prepared_statements changed while clients are connected, and the log line of a
reused statement name (docs/prepared-statements.md), against a real pypool and PostgreSQL.

One server (default_pool_size = 1) and psycopg preparing every query (prepare_threshold =
0), so `pg_prepared_statements` on that server is the pooler's cache for it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import pq

from tests.conftest import ADMIN_PASSWORD, ADMIN_USER, Pooler, PoolerFactory
from tests.integration.app_client import CONNECT_TIMEOUT, connect
from tests.integration.polling import wait_for

pytestmark = pytest.mark.timeout(60)


def preparing(p: Pooler) -> psycopg.Connection[Any]:
    return psycopg.connect(p.dsn(), autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                           prepare_threshold=0)


def on_server(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute("SELECT name FROM pg_prepared_statements ORDER BY name",
                        prepare=False).fetchall()
    return [row[0] for row in rows]


def set_cap(p: Pooler, value: int) -> None:
    with connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD)) as admin:
        admin.execute(f"SET max_prepared_statements = {value}")


def test_a_new_cap_applies_to_the_servers_already_open(pooler: PoolerFactory) -> None:
    p = pooler(ini_overrides={"default_pool_size": "1", "max_prepared_statements": "1"})
    with preparing(p) as conn:
        for i in range(4):
            assert conn.execute(f"SELECT '{i}'").fetchone() == (str(i),)
        assert len(on_server(conn)) == 1
        set_cap(p, 4)
        for i in range(4, 8):
            assert conn.execute(f"SELECT '{i}'").fetchone() == (str(i),)
        assert len(on_server(conn)) == 4
        set_cap(p, 2)
        assert len(on_server(conn)) == 4  # nothing is closed until the next one is prepared
        assert conn.execute("SELECT '8'").fetchone() == ("8",)
        names = on_server(conn)
        assert len(names) == 2 and all(name.startswith("PYPOOL_") for name in names)


def test_turning_it_off_keeps_the_connected_clients_statements(pooler: PoolerFactory) -> None:
    """PgBouncer stops rewriting at once, so a connected client's next Bind of a statement
    it prepared fails; in pypool it goes on working, and only later clients get their
    names passed through to the server."""
    p = pooler(ini_overrides={"default_pool_size": "1", "max_prepared_statements": "3"})
    with preparing(p) as early:
        assert early.execute("SELECT 'a'").fetchone() == ("a",)
        set_cap(p, 0)
        assert early.execute("SELECT 'a'").fetchone() == ("a",)  # Bind of its statement
        assert early.execute("SELECT 'b'").fetchone() == ("b",)  # a new one, still rewritten
    with preparing(p) as late:
        assert late.execute("SELECT 'c'").fetchone() == ("c",)
        names = on_server(late)
        assert "_pg3_0" in names  # psycopg's own name, untouched
        assert len([n for n in names if n.startswith("PYPOOL_")]) == 2


def test_a_reused_name_is_refused_and_logged_in_pgbouncers_words(pooler: PoolerFactory) -> None:
    p = pooler()
    with connect(p.dsn()) as conn:
        assert conn.pgconn.prepare(b"twice", b"SELECT 1").status == pq.ExecStatus.COMMAND_OK
        again = conn.pgconn.prepare(b"twice", b"SELECT 1")
        assert again.status == pq.ExecStatus.FATAL_ERROR
        assert again.error_field(pq.DiagnosticField.SQLSTATE) == b"42P05"
        # Not fatal, unlike PgBouncer: the connection and the statement carry on.
        assert conn.pgconn.exec_prepared(b"twice", []).status == pq.ExecStatus.TUPLES_OK
    assert wait_for(lambda: "prepared statement 'twice' was already prepared" in p.log(), 5)
