"""queue_policy and server_policy against a real PostgreSQL: a policy swapped, and its effect
seen in who is served first (the order of the waiters' nextval() from one sequence) and in
which backend (pg_backend_pid()) serves consecutive transactions."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pypool.embedded import EmbeddedPostgres
from tests.admin.console_client import console, show
from tests.conftest import Pooler, PoolerFactory
from tests.integration.app_client import connect
from tests.integration.polling import wait_for

pytestmark = pytest.mark.timeout(40)


@pytest.fixture
def sequence(postgres: EmbeddedPostgres) -> Iterator[str]:
    name = f"s_{time.monotonic_ns()}"
    postgres.execute(f"CREATE SEQUENCE {name}; ALTER SEQUENCE {name} OWNER TO app",
                     dbname="app")
    yield name
    postgres.execute(f"DROP SEQUENCE IF EXISTS {name}", dbname="app")


def waiting(p: Pooler) -> int:
    with console(p) as admin:
        return sum(r["cl_waiting"] for r in show(admin, "POOLS") if r["database"] == "app")


def service_order(p: Pooler, sequence: str, names: Sequence[str]) -> list[str]:
    """Queue one client per application name, in that order, behind a client holding the
    only server; release it; return the names in the order they were served."""
    holder = connect(p.dsn())
    holder.execute("BEGIN")
    holder.execute("SELECT 1")
    clients = [connect(p.dsn() + f"?application_name={name}") for name in names]
    served: dict[str, int] = {}
    threads = []

    def run(name: str, conn: psycopg.Connection[Any]) -> None:
        served[name] = conn.execute(f"SELECT nextval('{sequence}')").fetchone()[0]

    for name, conn in zip(names, clients, strict=True):
        thread = threading.Thread(target=run, args=(name, conn))
        thread.start()
        threads.append(thread)
        assert wait_for(lambda: waiting(p) == len(threads), 5)  # queued in this order
    holder.execute("COMMIT")
    for thread in threads:
        thread.join(10)
    for conn in [holder, *clients]:
        conn.close()
    return sorted(served, key=served.__getitem__)


def test_fifo_by_default_lifo_after_a_reload(pooler: PoolerFactory, sequence: str) -> None:
    p = pooler({"default_pool_size": "1"})
    assert service_order(p, sequence, ["a", "b", "c"]) == ["a", "b", "c"]
    p.rewrite_config({"queue_policy": "lifo"})
    p.reload()
    assert wait_for(lambda: "queue_policy lifo" in p.log(), 5), p.log()
    with console(p) as admin:
        config = {r["key"]: r for r in show(admin, "CONFIG")}
    assert config["queue_policy"]["value"] == "lifo"
    assert config["queue_policy"]["default"] == "fifo"
    assert service_order(p, sequence, ["a", "b", "c"]) == ["c", "b", "a"]


def test_priority_by_application_name(pooler: PoolerFactory, sequence: str) -> None:
    p = pooler({"default_pool_size": "1", "queue_policy": "priority",
                "queue_priority": "application_name: web=10, report=5"})
    order = service_order(p, sequence, ["batch", "report", "web", "batch2", "web2"])
    # web first, then report, then the unlisted ones (weight 0) oldest first
    assert order == ["web", "report", "batch", "batch2", "web2"]


def test_a_researchers_own_policy_by_module_and_class(
        pooler: PoolerFactory, sequence: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_policies.py").write_text(
        "class Alphabetical:\n"
        "    name = 'alphabetical'\n"
        "    def take(self, waiting):\n"
        "        best = min(waiting, key=lambda c: c.params.get('application_name', ''))\n"
        "        waiting.remove(best)\n"
        "        return best\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    p = pooler({"default_pool_size": "1", "queue_policy": "my_policies:Alphabetical"})
    assert service_order(p, sequence, ["c", "a", "d", "b"]) == ["a", "b", "c", "d"]


def backend_pids(p: Pooler, count: int) -> list[int]:
    with connect(p.dsn()) as conn:
        return [conn.execute("SELECT pg_backend_pid()").fetchone()[0] for _ in range(count)]


def three_servers_released(p: Pooler) -> None:
    """Three servers opened at once, then released in this order."""
    holders = [connect(p.dsn()) for _ in range(3)]
    for conn in holders:
        conn.execute("BEGIN")
        conn.execute("SELECT 1")
    for conn in holders:
        conn.execute("COMMIT")
        conn.close()


@pytest.mark.parametrize(("policy", "distinct"), [
    ("lifo", 1), ("fifo", 3), ("lru", 3), ("round_robin", 3)])
def test_server_policy_spreads_or_concentrates(pooler: PoolerFactory, policy: str,
                                               distinct: int) -> None:
    p = pooler({"default_pool_size": "3", "server_policy": policy})
    three_servers_released(p)
    pids = backend_pids(p, 9)
    assert len(set(pids)) == distinct, pids
    if distinct == 3:  # each in turn: the same cycle three times
        assert pids[:3] == pids[3:6] == pids[6:]


def test_server_round_robin_uses_the_servers_in_turn(pooler: PoolerFactory) -> None:
    """PgBouncer's server_round_robin = 1: as server_policy = fifo."""
    p = pooler({"default_pool_size": "3", "server_round_robin": "1"})
    three_servers_released(p)
    pids = backend_pids(p, 6)
    assert len(set(pids)) == 3 and pids[:3] == pids[3:], pids


def test_an_unknown_policy_is_refused_naming_the_key(pooler: PoolerFactory) -> None:
    p = pooler({"default_pool_size": "1"})
    p.rewrite_config({"server_policy": "random"})
    p.reload()
    assert wait_for(lambda: "reload failed" in p.log(), 5), p.log()
    assert "server_policy" in p.log() and "random" in p.log()
    with console(p) as admin:
        config = {r["key"]: r["value"] for r in show(admin, "CONFIG")}
    assert config["server_policy"] == "lifo"
