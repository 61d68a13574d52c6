"""The server's password changes under a running pool (ALTER ROLE), as PgBouncer's
kill_pool_logins handles it: when a new server's login fails and no server the pool could
still use is left, every client queued for one is told the server's error at once. A
server being replaced (RECONNECT) does not count as usable, even while a client still holds
it. Each failed login is logged twice, as PgBouncer logs it: `server login failed: ...`
then `closing because: <the server's message>`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres
from tests.admin.console_client import console, row
from tests.conftest import Pooler, PoolerFactory
from tests.integration.app_client import connect
from tests.integration.polling import wait_for

pytestmark = pytest.mark.timeout(60)

ROLE = "pw_changes"


@pytest.fixture
def server_role(postgres: EmbeddedPostgres) -> Iterator[str]:
    """A role the pool logs into the server as, whose password the test changes."""
    postgres.create_role(ROLE, "first")
    try:
        yield ROLE
    finally:
        postgres.execute(f"DROP ROLE IF EXISTS {ROLE}")


def start(pooler: PoolerFactory, postgres: EmbeddedPostgres, **settings: str) -> Pooler:
    server = f"host={postgres.host} port={postgres.port}"
    return pooler(ini_overrides={"default_pool_size": "1", "query_wait_timeout": "30",
                                 **settings},
                  databases={"app": f"{server} dbname=app user={ROLE} password=first"})


class Queued(threading.Thread):
    def __init__(self, p: Pooler) -> None:
        super().__init__(daemon=True)
        self.conn = connect(p.dsn())
        self.error: BaseException | None = None
        self.finished_at = 0.0

    def run(self) -> None:
        try:
            self.conn.execute("SELECT 1")
        except psycopg.Error as exc:
            self.error = exc
        self.finished_at = time.monotonic()


def closing_lines(p: Pooler) -> int:
    return p.log().count('closing because: password authentication failed for user')


def test_reconnect_with_a_changed_password_fails_the_queue_at_once(
        postgres: EmbeddedPostgres, pooler: PoolerFactory, server_role: str) -> None:
    p = start(pooler, postgres)
    with connect(p.dsn()) as holder:
        holder.execute("SELECT 1")  # the pool's one server logs in with the old password
        postgres.execute(f"ALTER ROLE {server_role} PASSWORD 'second'")
        holder.execute("BEGIN")
        holder.execute("SELECT 1")  # holds that server
        queue = [Queued(p) for _ in range(3)]
        for waiter in queue:
            waiter.start()
        with console(p) as admin:
            assert wait_for(lambda: row(admin, "POOLS", database="app")["cl_waiting"] == 3, 5)
            admin.execute("RECONNECT")  # the held server is to be replaced
            admin.execute("SET default_pool_size = 2")  # a new one is tried: it fails
        tried_at = time.monotonic()
        for waiter in queue:
            waiter.join(5)
            assert isinstance(waiter.error, psycopg.OperationalError), waiter.error
            assert "password authentication failed" in str(waiter.error)
            assert waiter.finished_at - tried_at < 3
            waiter.conn.close()
        assert holder.execute("SELECT 2").fetchone() == (2,)  # the holder carries on
        holder.execute("COMMIT")
    # Three clients and the server, in PgBouncer's words.
    assert wait_for(lambda: closing_lines(p) == 4, 5), p.log()
    assert "server login failed: FATAL password authentication failed" in p.log()


def test_without_reconnect_a_held_server_keeps_the_queue_waiting(
        postgres: EmbeddedPostgres, pooler: PoolerFactory, server_role: str) -> None:
    """Only a server that will be replaced is written off: a client queued behind a
    working one waits for it, though the second server's login failed."""
    p = start(pooler, postgres, default_pool_size="2")
    with connect(p.dsn()) as holder:
        holder.execute("SELECT 1")
        postgres.execute(f"ALTER ROLE {server_role} PASSWORD 'second'")
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        waiter = Queued(p)
        waiter.start()  # wants a second server, whose login fails
        assert wait_for(lambda: "server login failed" in p.log(), 5), p.log()
        time.sleep(0.3)
        assert waiter.is_alive()  # still queued for the holder's server
        holder.execute("COMMIT")
        waiter.join(5)
        assert waiter.error is None, waiter.error
        waiter.conn.close()


def test_server_lifetime_then_a_changed_password(
        postgres: EmbeddedPostgres, pooler: PoolerFactory, server_role: str) -> None:
    p = start(pooler, postgres, server_lifetime="1")
    with connect(p.dsn()) as first:
        first.execute("SELECT 1")
    postgres.execute(f"ALTER ROLE {server_role} PASSWORD 'second'")
    with console(p) as admin:
        assert wait_for(lambda: row(admin, "POOLS", database="app")["sv_idle"] == 0, 5)
    errors: list[Any] = []
    for _ in range(3):
        with pytest.raises(psycopg.OperationalError) as info:
            with connect(p.dsn()) as conn:
                conn.execute("SELECT 1")
        errors.append(info.value)
    assert "password authentication failed" in str(errors[0])
    assert all("password authentication failed" in str(e) for e in errors)
    assert wait_for(lambda: closing_lines(p) >= 2, 5), p.log()  # the client and the server
