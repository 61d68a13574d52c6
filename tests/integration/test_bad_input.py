"""Hostile and broken input on raw sockets: the pooler answers in the protocol where there is
one, closes the connection where there is not, and keeps serving everyone else."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable

import psycopg
import pytest

from pypool.protocol import messages as m

from .rawclient import SSL_REQUEST, RawClient

pytestmark = pytest.mark.timeout(60)

TRUST = {"auth_type": "trust"}


def still_serves(p) -> None:  # type: ignore[no-untyped-def]
    """A normal client can log in through the pooler `p` and run a query."""
    with psycopg.connect(p.dsn(), connect_timeout=5) as conn:
        assert conn.execute("SELECT 40 + 2").fetchone() == (42,)


def test_garbage_before_startup_closes_and_pooler_serves_others(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")
        assert raw.is_closed()
    still_serves(p)


@pytest.mark.parametrize("length", [0, 4, 7, 10001, 0x7FFFFFFF])
def test_startup_packet_with_invalid_length(pooler: Callable, length: int) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send(struct.pack("!II", length, 196608) + b"user\x00app\x00\x00")
        assert raw.is_closed()
    still_serves(p)


def test_startup_packet_with_unknown_protocol_gets_fatal(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send_startup({"user": "app", "database": "app"}, major=2)
        error = raw.read_error_and_close()
    assert error["S"] == "FATAL"
    assert error["C"] == "08P01"
    assert "protocol" in error["M"]
    still_serves(p)


def test_malformed_startup_strings_get_fatal(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        body = b"user\x00app\x00database\x00\x00"  # three strings: a name without value
        raw.send(struct.pack("!II", len(body) + 8, 196608) + body)
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "08P01")


def test_oversized_message_after_login_is_fatal_08p01(pooler: Callable) -> None:
    p = pooler({**TRUST, "max_packet_size": "2048"})
    with RawClient(p.host, p.port) as raw:
        assert raw.login("app", "app").error is None
        rows, _, _ = raw.simple_query("SELECT 'small'")
        assert rows == [["small"]]
        raw.query("SELECT '" + "x" * 5000 + "'")
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "08P01")
    still_serves(p)


def test_oversized_header_alone_is_enough(pooler: Callable) -> None:
    # Only the header of a 100 MB message: rejected without waiting for the body.
    p = pooler({**TRUST, "max_packet_size": "2048"})
    with RawClient(p.host, p.port) as raw:
        assert raw.login("app", "app").error is None
        raw.send(b"Q" + struct.pack("!I", 100 * 1024 * 1024))
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "08P01")


def test_oversized_message_during_password_exchange(pooler: Callable) -> None:
    p = pooler({"max_packet_size": "1024"})  # scram-sha-256
    with RawClient(p.host, p.port) as raw:
        raw.send_startup({"user": "app", "database": "app"})
        kind, body = raw.read_message() or (0, b"")
        assert kind == m.AUTHENTICATION and m.parse_authentication(body)[0] == m.AUTH_SASL
        raw.send(m.sasl_initial_response("SCRAM-SHA-256", b"n,,n=,r=" + b"a" * 4000))
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "08P01")
    still_serves(p)


def test_truncated_startup_then_close(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send(struct.pack("!II", 40, 196608) + b"user\x00ap")
    still_serves(p)


def test_truncated_message_after_login_then_close_leaks_nothing(
    pooler: Callable, postgres, pg_activity: Callable  # type: ignore[no-untyped-def]
) -> None:
    p = pooler({**TRUST, "default_pool_size": "1", "query_wait_timeout": "5"})
    for _ in range(3):
        with RawClient(p.host, p.port) as raw:
            assert raw.login("app", "app").error is None
            raw.simple_query("SELECT 1")
            whole = m.query("SELECT pg_sleep(0)")
            raw.send(whole[:-3])
    # With one server in the pool, any leak would make this wait for ever.
    with psycopg.connect(p.dsn(), connect_timeout=5) as conn:
        conn.execute("SET statement_timeout = '5s'")
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert pg_activity(postgres, "app", "app") <= 1


def test_unknown_message_type_after_login_is_fatal_08p01(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        assert raw.login("app", "app").error is None
        raw.send(m.message(ord("y"), b"whatever"))
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "08P01")
    still_serves(p)


def test_unknown_message_type_mid_transaction_releases_the_server(
    pooler: Callable, postgres, pg_activity: Callable  # type: ignore[no-untyped-def]
) -> None:
    p = pooler({**TRUST, "default_pool_size": "1", "query_wait_timeout": "5"})
    with RawClient(p.host, p.port) as raw:
        assert raw.login("app", "app").error is None
        _, _, status = raw.simple_query("BEGIN")
        assert status == m.TX_IN_BLOCK
        raw.simple_query("CREATE TEMP TABLE t_bad_input (x int)")
        raw.send(m.message(ord("y"), b""))
        error = raw.read_error_and_close()
    assert error["C"] == "08P01"
    # The only server was mid-transaction: it must not be handed on with that transaction.
    with psycopg.connect(p.dsn(), connect_timeout=5, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname = 't_bad_input'"
                            ).fetchone() == (0,)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_ssl_request_answered_n_then_login(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send(SSL_REQUEST)
        assert raw.read_bytes(1) == b"N"
        login = raw.login("app", "app")
        assert login.error is None
        assert raw.simple_query("SELECT 'after ssl'")[0] == [["after ssl"]]


def test_gssenc_request_answered_n_then_login(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send(struct.pack("!II", 8, 80877104))
        assert raw.read_bytes(1) == b"N"
        raw.send(SSL_REQUEST)
        assert raw.read_bytes(1) == b"N"
        assert raw.login("app", "app").error is None
        assert raw.simple_query("SELECT 1")[0] == [["1"]]


def test_libpq_sslmode_prefer_falls_back_to_plaintext(pooler: Callable) -> None:
    p = pooler()
    with psycopg.connect(p.dsn() + "?sslmode=prefer", connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(p.dsn() + "?sslmode=require", connect_timeout=5)


def test_protocol_3_1_gets_negotiate_protocol_version(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send_startup(
            {"user": "app", "database": "app", "_pq_.something": "on"}, minor=1
        )
        first = raw.read_message()
        assert first is not None
        kind, body = first
        assert kind == m.NEGOTIATE_PROTOCOL_VERSION
        newest, count = struct.unpack_from("!II", body)
        assert (newest, count) == (0x00030000, 1)  # 3.0, as PostgreSQL spells it
        assert body[8:] == b"_pq_.something\x00"
        messages = raw.read_until(m.READY_FOR_QUERY)
        kinds = [k for k, _ in messages]
        assert m.ERROR_RESPONSE not in kinds
        assert m.AUTHENTICATION in kinds
        assert raw.simple_query("SELECT 'v3.1'")[0] == [["v3.1"]]


def test_unsupported_startup_parameter_is_fatal(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        login = raw.login("app", "app", work_mem="64MB")
    assert login.error is not None
    assert login.error["S"] == "FATAL"
    assert login.error["M"] == "unsupported startup parameter: work_mem"


def test_ignored_startup_parameter_is_accepted(pooler: Callable) -> None:
    p = pooler({**TRUST, "ignore_startup_parameters": "extra_float_digits, search_path"})
    with RawClient(p.host, p.port) as raw:
        login = raw.login("app", "app", search_path="public", extra_float_digits="2")
        assert login.error is None
        assert raw.simple_query("SELECT 1")[0] == [["1"]]


def test_tracked_startup_parameter_is_applied(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        login = raw.login("app", "app", application_name="raw-tracked")
        assert login.error is None
        assert login.params.get("application_name") == "raw-tracked"
        rows, _, _ = raw.simple_query("SHOW application_name")
        assert rows == [["raw-tracked"]]


def test_no_user_is_fatal(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send_startup({"database": "app"})
        error = raw.read_error_and_close()
    assert error["S"] == "FATAL"


def test_cancel_request_with_unknown_key_is_dropped(pooler: Callable) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send(m.cancel_request(12345, 67890))
        assert raw.read_message() is None  # closed, nothing said
    still_serves(p)


def test_client_login_timeout(pooler: Callable) -> None:
    p = pooler({**TRUST, "client_login_timeout": "1"})
    with RawClient(p.host, p.port) as raw:
        started = time.monotonic()
        raw.send(struct.pack("!I", 40))  # half a startup packet, then silence
        assert raw.is_closed()
        assert time.monotonic() - started < 5


def test_200_garbage_connections_then_a_normal_client(pooler: Callable) -> None:
    p = pooler(TRUST)
    payloads = [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
        b"GET / HTTP/1.0\r\n\r\n",
        b"\x00\x00\x00\x02",
        b"",
        os.urandom(64),
    ]
    for i in range(200):
        with socket.create_connection((p.host, p.port), timeout=5) as sock:
            data = payloads[i % len(payloads)]
            if data:
                try:
                    sock.sendall(data)
                except OSError:
                    pass
    still_serves(p)
    assert p.proc.poll() is None


def test_startup_and_query_one_byte_at_a_time(pooler: Callable) -> None:
    p = pooler({**TRUST, "default_pool_size": "1", "query_wait_timeout": "5"})
    with RawClient(p.host, p.port) as raw:
        raw.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = b"user\x00app\x00database\x00app\x00application_name\x00slow\x00\x00"
        data = struct.pack("!II", len(body) + 8, 196608) + body
        for i in range(len(data)):
            raw.send(data[i : i + 1])
            time.sleep(0.002)
        kinds = [k for k, _ in raw.read_until(m.READY_FOR_QUERY)]
        assert m.ERROR_RESPONSE not in kinds
        query = m.query("SELECT current_setting('application_name')") + m.query("SELECT 2")
        for i in range(len(query)):
            raw.send(query[i : i + 1])
            time.sleep(0.002)
        first = raw.read_until(m.READY_FOR_QUERY)
        assert any(k == m.DATA_ROW and body.endswith(b"slow") for k, body in first)
        second = raw.read_until(m.READY_FOR_QUERY)
        assert any(k == m.DATA_ROW and body.endswith(b"2") for k, body in second)
    still_serves(p)


def test_query_instead_of_password_is_fatal(pooler: Callable) -> None:
    p = pooler()  # scram-sha-256
    with RawClient(p.host, p.port) as raw:
        raw.send_startup({"user": "app", "database": "app"})
        kind, _ = raw.read_message() or (0, b"")
        assert kind == m.AUTHENTICATION
        raw.query("SELECT 1")
        error = raw.read_error_and_close()
    assert error["S"] == "FATAL"
    still_serves(p)


def _startup_packet(user: str = "app") -> bytes:
    body = b"user\x00" + user.encode() + b"\x00database\x00app\x00\x00"
    return struct.pack("!II", len(body) + 8, 196608) + body


@pytest.mark.parametrize("auth_type", ["scram-sha-256", "md5", "plain"])
def test_a_second_startup_packet_during_the_password_exchange_is_answered_at_once(
        pooler: Callable, auth_type: str) -> None:
    """PostgreSQL and PgBouncer answer at once; read as a typed message (type 0, a length
    of thousands) it once waited for client_login_timeout."""
    p = pooler({"auth_type": auth_type})
    with RawClient(p.host, p.port, timeout=5) as raw:
        raw.send_startup({"user": "app", "database": "app"})
        kind, _ = raw.read_message() or (0, b"")
        assert kind == m.AUTHENTICATION
        raw.send(_startup_packet())
        error = raw.read_error_and_close()  # within the 5 s timeout, not 60
    assert error["S"] == "FATAL" and error["C"] in ("08P01", "28000")
    still_serves(p)


def test_a_startup_packet_after_login_is_answered_at_once(pooler: Callable) -> None:
    p = pooler({"auth_type": "trust"})
    with RawClient(p.host, p.port, timeout=5) as raw:
        assert raw.login("app", "app").error is None
        raw.send(_startup_packet())
        error = raw.read_error_and_close()
    assert error["S"] == "FATAL" and error["C"] == "08P01"
    assert "unsupported pkt type: 0" in error["M"]
    still_serves(p)


def test_sasl_with_an_unoffered_mechanism_fails(pooler: Callable) -> None:
    p = pooler()
    with RawClient(p.host, p.port) as raw:
        raw.send_startup({"user": "app", "database": "app"})
        kind, _ = raw.read_message() or (0, b"")
        assert kind == m.AUTHENTICATION
        raw.send(m.sasl_initial_response("SCRAM-SHA-256-PLUS", b"p=tls-server-end-point,,n=,r=x"))
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "28P01")


def test_garbage_sasl_messages_fail_cleanly(pooler: Callable) -> None:
    p = pooler()
    for payload in (b"", b"\x00", b"SCRAM-SHA-256\x00\x00\x00", os.urandom(40)):
        with RawClient(p.host, p.port) as raw:
            raw.send_startup({"user": "app", "database": "app"})
            kind, _ = raw.read_message() or (0, b"")
            assert kind == m.AUTHENTICATION
            raw.send(m.password_message(payload))
            error = raw.read_error_and_close()
        assert error["S"] == "FATAL", payload
    still_serves(p)
