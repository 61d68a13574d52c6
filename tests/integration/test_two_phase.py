"""Two-phase commit through the pooler: PREPARE TRANSACTION, COMMIT PREPARED, ROLLBACK
PREPARED and recovery by gid behave exactly as on a direct connection, from several clients
that share servers.

`PREPARE TRANSACTION 'gid'` begins with the same word as a SQL-level `PREPARE name AS ...`;
once it was taken for a prepared statement named `transaction`, and the hidden DEALLOCATE the
pooler sent before the next one aborted that client's transaction (its writes lost while its
driver reported the prepare as done). The embedded cluster runs with
max_prepared_transactions > 0 (pypool.embedded).
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

from . import pgwire
from .pgwire import Wire

Q = pgwire.query

pytestmark = pytest.mark.timeout(90)


def _gid(tag: str) -> str:
    return f"pypool-{tag}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def ledger_table(postgres):
    name = f"twophase_{uuid.uuid4().hex[:8]}"
    postgres.execute(f"CREATE TABLE {name} (id int, who text)", dbname="app")
    postgres.execute(f"ALTER TABLE {name} OWNER TO app", dbname="app")
    yield name
    for (gid,) in postgres.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'pypool-%'", dbname="app"):
        postgres.execute(f"ROLLBACK PREPARED '{gid}'", dbname="app")
    postgres.execute(f"DROP TABLE {name}", dbname="app")


def _count(postgres, table: str) -> int:
    return postgres.execute(f"SELECT count(*) FROM {table}", dbname="app")[0][0]


def _prepared_gids(postgres) -> set[str]:
    return {row[0] for row in postgres.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'pypool-%'", dbname="app")}


def _two_phase_rounds(dsn: str, table: str, clients: int, rounds: int) -> list[str]:
    """Each round every client inserts a row, PREPARE TRANSACTIONs it, and the next client
    commits it by gid. Returns the command tags the clients were given, in order."""
    tags: list[str] = []
    conns = [psycopg.connect(dsn, autocommit=True, connect_timeout=10) for _ in range(clients)]
    try:
        for r in range(rounds):
            gids = []
            for i, conn in enumerate(conns):
                gid = _gid(f"r{r}c{i}")
                conn.execute("BEGIN")
                conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (r, f"c{i}"))
                cur = conn.execute(f"PREPARE TRANSACTION '{gid}'")
                tags.append(cur.statusmessage or "")
                gids.append(gid)
            for i, gid in enumerate(gids):
                cur = conns[(i + 1) % clients].execute(f"COMMIT PREPARED '{gid}'")
                tags.append(cur.statusmessage or "")
    finally:
        for conn in conns:
            conn.close()
    return tags


def test_prepare_transaction_keeps_every_write_as_directly(pooler, postgres, ledger_table):
    # One server for three clients: every PREPARE TRANSACTION lands where another ran.
    p = pooler(ini_overrides={"default_pool_size": "1"})
    direct_table = ledger_table
    via = _two_phase_rounds(p.dsn(), ledger_table, clients=3, rounds=3)
    assert _count(postgres, ledger_table) == 9
    direct = _two_phase_rounds(
        postgres.dsn(dbname="app", user="app", password="app-secret"), direct_table, 3, 3)
    assert via == direct
    assert set(via) == {"PREPARE TRANSACTION", "COMMIT PREPARED"}
    assert _count(postgres, ledger_table) == 18
    assert _prepared_gids(postgres) == set()


def test_rollback_prepared_and_recovery_by_gid(pooler, postgres, ledger_table):
    p = pooler(ini_overrides={"default_pool_size": "2"})
    kept, dropped = _gid("kept"), _gid("dropped")
    for gid in (kept, dropped):
        # The client that prepares leaves: the transaction outlives its session.
        with psycopg.connect(p.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute("BEGIN")
            conn.execute(f"INSERT INTO {ledger_table} VALUES (1, %s)", (gid,))
            assert conn.execute(f"PREPARE TRANSACTION '{gid}'").statusmessage == (
                "PREPARE TRANSACTION")
    assert _count(postgres, ledger_table) == 0
    with psycopg.connect(p.dsn(), autocommit=True, connect_timeout=10) as conn:
        # Recovery: a new client finds the gids and settles them.
        found = {row[0] for row in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'pypool-%'")}
        assert found == {kept, dropped}
        assert conn.execute(f"COMMIT PREPARED '{kept}'").statusmessage == "COMMIT PREPARED"
        assert conn.execute(f"ROLLBACK PREPARED '{dropped}'").statusmessage == (
            "ROLLBACK PREPARED")
        with pytest.raises(psycopg.errors.UndefinedObject):  # 42704, as directly
            conn.execute(f"COMMIT PREPARED '{dropped}'")
        rows = conn.execute(f"SELECT who FROM {ledger_table}").fetchall()
    assert rows == [(kept,)]
    assert _prepared_gids(postgres) == set()


async def test_two_phase_replies_match_a_direct_connection(pooler, postgres, ledger_table):
    """Message by message, two clients on one server, against one direct session."""
    p = pooler(ini_overrides={"default_pool_size": "1"})
    a = await Wire.connect(p.host, p.port, "app", "app-secret", "app")
    b = await Wire.connect(p.host, p.port, "app", "app-secret", "app")
    plain = await Wire.connect(postgres.host, postgres.port, "app", "app-secret", "app")
    try:
        for round_ in range(3):
            for who, wire in (("a", a), ("b", b)):
                gid = _gid(f"{who}{round_}")
                script = [
                    "BEGIN",
                    f"INSERT INTO {ledger_table} VALUES ({round_}, '{who}')",
                    f"PREPARE TRANSACTION '{gid}'",
                    "SELECT count(*) FROM pg_prepared_xacts WHERE gid = '" + gid + "'",
                    f"COMMIT PREPARED '{gid}'",
                    f"COMMIT PREPARED '{gid}'",  # 42704 both ways
                ]
                for sql in script:
                    got = await wire.run(Q(sql))
                    want = await plain.run(Q(sql.replace(gid, gid + "-d")))
                    assert got == [tuple(str(f).replace(gid + "-d", gid) if isinstance(f, str)
                                         else f for f in reply) for reply in want], sql
    finally:
        for wire in (a, b, plain):
            await wire.close()
    assert _count(postgres, ledger_table) == 12


async def test_a_statement_named_transaction_still_follows_its_client(pooler, postgres):
    """`PREPARE transaction AS ...` is a prepared statement named transaction (an unreserved
    keyword): it is tracked, and EXECUTEd on whichever server the client lands on."""
    p = pooler(ini_overrides={"default_pool_size": "2"})
    a = await Wire.connect(p.host, p.port, "app", "app-secret", "app")
    b = await Wire.connect(p.host, p.port, "app", "app-secret", "app")
    plain = await Wire.connect(postgres.host, postgres.port, "app", "app-secret", "app")
    try:
        for sql in ("PREPARE transaction AS SELECT 41 + 1", "EXECUTE transaction"):
            assert await a.run(Q(sql)) == await plain.run(Q(sql))
        assert await b.run(Q("BEGIN")) == [("C", "BEGIN"), ("Z", "T")]  # holds one server
        got = await a.run(Q("EXECUTE transaction"))
        assert got == await plain.run(Q("EXECUTE transaction"))
        assert ("D", ("42",)) in got
        await b.run(Q("COMMIT"))
    finally:
        for wire in (a, b, plain):
            await wire.close()
