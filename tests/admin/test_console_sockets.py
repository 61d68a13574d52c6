"""The console commands PgBouncer's online-restart tooling and its test suite use: SHOW
SOCKETS, ACTIVE_SOCKETS, FDS, MEM, SUSPEND and RESUME, and the one id sequence shared by
clients and servers, against a running pypool."""

from __future__ import annotations

import threading

import psycopg
import pytest

from tests.admin.console_client import STATS_PASSWORD, STATS_USER, app, columns, console, show
from tests.conftest import Pooler

pytestmark = pytest.mark.timeout(60)

TEXT, INT4, INT8 = 25, 23, 20
_STD = "ssssssisiTTiiississii"
_NAMES = ("type user database replication state addr port local_addr local_port connect_time "
          "request_time wait wait_us close_needed ptr link remote_pid tls application_name "
          "prepared_statements id recv_pos pkt_pos pkt_remain send_pos send_remain pkt_avail "
          "send_avail").split()
SOCKET_COLUMNS = [(name, {"s": TEXT, "T": TEXT, "i": INT4}[t])
                  for name, t in zip(_NAMES, _STD + "iiiiiii", strict=True)]


def test_show_sockets_lists_every_client_and_server_by_list_name(bouncer: Pooler) -> None:
    with console(bouncer) as admin, app(bouncer) as client:
        client.execute("BEGIN")
        client.execute("SELECT 1")  # holds a server
        assert columns(admin, "SOCKETS") == SOCKET_COLUMNS
        assert columns(admin, "ACTIVE_SOCKETS") == SOCKET_COLUMNS
        rows = show(admin, "SOCKETS")
        states = sorted((r["type"], r["database"], r["state"]) for r in rows)
        assert ("C", "app", "cl_active") in states
        assert ("S", "app", "sv_active") in states
        assert ("C", "pgbouncer", "cl_active") in states  # the console itself
        client.execute("COMMIT")
        idle = {r["state"] for r in show(admin, "SOCKETS") if r["type"] == "S"}
        assert idle == {"sv_idle"}


def test_clients_and_servers_share_one_id_sequence(bouncer: Pooler) -> None:
    with console(bouncer) as admin:
        with app(bouncer) as client:
            client.execute("SELECT 1")
            ids = [r["id"] for r in show(admin, "SOCKETS")]
            assert len(ids) == len(set(ids))
            client_ids = {r["id"] for r in show(admin, "CLIENTS")}
            server_ids = {r["id"] for r in show(admin, "SERVERS")}
            assert client_ids and server_ids and not client_ids & server_ids


def test_show_mem_and_fds(bouncer: Pooler) -> None:
    with console(bouncer) as admin, app(bouncer) as client:
        client.execute("SELECT 1")
        mem = {r["name"]: r for r in show(admin, "MEM")}
        assert mem["client_cache"]["used"] >= 2 and mem["server_cache"]["used"] >= 1
        fds = show(admin, "FDS")
        assert {r["task"] for r in fds} == {"client", "server"}
        assert all(r["fd"] > 2 for r in fds)
    with console(bouncer, STATS_USER, STATS_PASSWORD) as reader:
        with pytest.raises(psycopg.errors.ProtocolViolation, match="admin access needed"):
            reader.execute("SHOW FDS")


def test_suspend_holds_new_transactions_until_resume(bouncer: Pooler) -> None:
    with console(bouncer) as admin, app(bouncer) as client:
        client.execute("SELECT 1")
        admin.execute("SUSPEND")
        assert show(admin, "STATE") == [{"key": "active", "value": "no"},
                                        {"key": "paused", "value": "no"},
                                        {"key": "suspended", "value": "yes"}]
        with pytest.raises(psycopg.errors.ProtocolViolation, match="already suspended/paused"):
            admin.execute("SUSPEND")
        done: list[object] = []
        held = threading.Thread(target=lambda: done.append(
            client.execute("SELECT 2").fetchone()))
        held.start()
        held.join(1.0)
        assert done == []  # waits while suspended
        admin.execute("RESUME")
        held.join(10)
        assert done == [(2,)]
        assert show(admin, "STATE")[2] == {"key": "suspended", "value": "no"}


def test_suspend_refuses_arguments_and_paused_databases(bouncer: Pooler) -> None:
    with console(bouncer) as admin:
        with pytest.raises(psycopg.errors.ProtocolViolation, match="invalid command"):
            admin.execute("SUSPEND app")
        admin.execute("PAUSE app")
        with pytest.raises(psycopg.errors.ProtocolViolation,
                           match="cannot suspend with paused databases"):
            admin.execute("SUSPEND")
        admin.execute("RESUME app")


def test_console_queries_count_in_the_pgbouncer_row_and_the_totals(bouncer: Pooler) -> None:
    with console(bouncer) as admin:
        def console_row() -> dict[str, object]:
            return next(r for r in show(admin, "STATS") if r["database"] == "pgbouncer")

        before = console_row()
        admin.execute("SHOW VERSION")
        admin.execute("SHOW LISTS")
        after = console_row()
        # The two SHOWs and the SHOW STATS that read the row (each counted as it arrives).
        assert after["total_query_count"] - before["total_query_count"] == 3
        assert after["total_xact_count"] - before["total_xact_count"] == 3
        totals = {r["name"]: r["value"] for r in show(admin, "TOTALS")}
        assert totals["total_query_count"] >= after["total_query_count"] + 1
