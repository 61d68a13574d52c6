"""The PROXY protocol (proxy_protocol_sources) against a real pypool and PostgreSQL.

`Balancer` stands in for HAProxy with `send-proxy` / `send-proxy-v2`: it accepts on
127.0.0.1, opens a connection to the pooler for each client, sends one header naming a
made-up client (203.0.113.5, TEST-NET-3), then relays bytes both ways, so that psycopg (with
SCRAM, TLS and cancel requests) runs through it unchanged. RawClient sends headers by hand.
The console is reached over the unix socket, which never reads a header.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pypool.protocol import messages as m
from pypool.protocol.proxy_header import proxy_v1, proxy_v2
from tests.conftest import ADMIN_PASSWORD, ADMIN_USER, APP_PASSWORD, APP_USER, Pooler

from .polling import wait_for
from .rawclient import SSL_REQUEST, RawClient
from .tls_ca import Certificates, certs, tls_settings

pytestmark = pytest.mark.timeout(60)

__all__ = ["certs"]  # the TLS fixture (tests/integration/tls_ca.py)

CLIENT = ("203.0.113.5", 5555)  # the address every header names
TRUST = {"auth_type": "trust"}


class Balancer:
    """A PROXY-protocol-speaking TCP relay in front of the pooler (see the module)."""

    def __init__(self, pooler_port: int, header: Callable[[], bytes]) -> None:
        self.pooler_port = pooler_port
        self.header = header
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.pooler_port), timeout=10)
            self.sockets += [client, upstream]
            upstream.sendall(self.header())
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@pytest.fixture
def balancers() -> Iterator[Callable[..., Balancer]]:
    made: list[Balancer] = []

    def make(p: Pooler, header: Callable[[], bytes] = lambda: proxy_v2(CLIENT)) -> Balancer:
        made.append(Balancer(p.port, header))
        return made[-1]

    yield make
    for balancer in made:
        balancer.close()


def behind(pooler: Callable[..., Pooler], **more: str) -> Pooler:
    """A pooler that takes headers from 127.0.0.1, where the tests' balancer and raw clients
    connect from."""
    return pooler({"proxy_protocol_sources": "10.0.0.0/8, 127.0.0.1", **more})


def connect(port: int, application_name: str = "", **params: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(host="127.0.0.1", port=port, user=APP_USER, password=APP_PASSWORD,
                           dbname="app", connect_timeout=5, autocommit=True,
                           application_name=application_name, **params)


def clients(p: Pooler) -> list[dict[str, Any]]:
    with psycopg.connect(host=str(p.ini_path.parent), port=p.port, user=ADMIN_USER,
                         password=ADMIN_PASSWORD, dbname="pgbouncer", autocommit=True,
                         prepare_threshold=None, connect_timeout=5) as admin:
        cur = admin.execute("SHOW CLIENTS")
        names = [c.name for c in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def client_row(p: Pooler, **match: Any) -> dict[str, Any]:
    [row] = [r for r in clients(p) if all(r[k] == v for k, v in match.items())]
    return row


def refused(raw: RawClient) -> str:
    """The FATAL error's message the pooler closed `raw` with."""
    error = raw.read_error_and_close()
    assert error["S"] == "FATAL" and error["C"] == "08P01", error
    return error["M"]


# --- the header's address is the client's ---------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_show_clients_and_the_log_show_the_header_address(
        pooler: Callable[..., Pooler], version: int) -> None:
    p = behind(pooler, **TRUST)
    header = (proxy_v1(CLIENT, ("198.51.100.1", 6432)) if version == 1
              else proxy_v2(CLIENT, ("198.51.100.1", 6432)))
    with RawClient(p.host, p.port) as raw:
        # The header and the startup packet in one write, as a balancer may send them.
        raw.send(header)
        login = raw.login(APP_USER, "app", application_name=f"raw-v{version}")
        assert login.error is None, login.error
        assert raw.simple_query("SELECT 1")[0] == [["1"]]
        row = client_row(p, application_name=f"raw-v{version}")
        assert (row["addr"], row["port"]) == CLIENT
    assert f"@{CLIENT[0]}:{CLIENT[1]}: login attempt" in p.log()


def test_psycopg_through_the_balancer_and_application_name_add_host(
        pooler: Callable[..., Pooler], balancers: Callable[..., Balancer]) -> None:
    p = behind(pooler, application_name_add_host="1")
    balancer = balancers(p)
    with connect(balancer.port, "web") as conn:
        assert conn.execute("SELECT 6 * 7").fetchone() == (42,)
        # application_name_add_host appends the header's address, and it reaches the server.
        name = f"web - {CLIENT[0]}:{CLIENT[1]}"
        assert conn.execute("SHOW application_name").fetchone() == (name,)
        row = client_row(p, application_name=name)
        assert (row["addr"], row["port"]) == CLIENT
    # The unix socket reads no header: the console above came in over it.


def test_a_v2_local_header_keeps_the_connection_address(pooler: Callable[..., Pooler]) -> None:
    p = behind(pooler, **TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send(proxy_v2(None))  # HAProxy's health checks
        assert raw.login(APP_USER, "app", application_name="local").error is None
        assert client_row(p, application_name="local")["addr"] == "127.0.0.1"


def test_hba_rules_match_the_header_address(pooler: Callable[..., Pooler],
                                            balancers: Callable[..., Balancer],
                                            tmp_path: Path) -> None:
    hba = tmp_path / "hba.conf"
    hba.write_text("host all all 203.0.113.0/24 trust\n"
                   "host all all 127.0.0.1/32 reject\n")
    p = behind(pooler, auth_type="hba", auth_hba_file=str(hba))
    # From the balancer, which names 203.0.113.5: trust, no password asked.
    with psycopg.connect(host="127.0.0.1", port=balancers(p).port, user=APP_USER, dbname="app",
                         connect_timeout=5, autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (APP_USER,)
    # The same balancer naming its own address: the reject line.
    local = balancers(p, lambda: proxy_v1(("127.0.0.1", 4444), ("127.0.0.1", 6432)))
    with pytest.raises(psycopg.OperationalError, match="login rejected"):
        connect(local.port)


def test_tls_after_the_header(pooler: Callable[..., Pooler], balancers: Callable[..., Balancer],
                              certs: Certificates) -> None:
    p = behind(pooler, **tls_settings(certs, "require"))
    balancer = balancers(p)
    with connect(balancer.port, "tls", sslmode="verify-ca",
                 sslrootcert=str(certs.ca.root)) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute("SELECT 1").fetchone() == (1,)
        row = client_row(p, application_name="tls")
        assert (row["addr"], row["port"]) == CLIENT and row["tls"].startswith("TLSv1.")
    # SSLRequest and the header in one write: 'S', then the handshake as usual.
    with RawClient(p.host, p.port) as raw:
        raw.send(proxy_v1(CLIENT, ("127.0.0.1", p.port)) + SSL_REQUEST)
        assert raw.read_bytes(1) == b"S"


def test_direct_tls_after_the_header(pooler: Callable[..., Pooler],
                                     balancers: Callable[..., Balancer],
                                     certs: Certificates) -> None:
    if psycopg.pq.version() < 170000:
        pytest.skip("direct TLS needs libpq 17")
    p = behind(pooler, **tls_settings(certs, "require"))
    with connect(balancers(p).port, "direct", sslmode="require",
                 sslnegotiation="direct") as conn:
        assert conn.pgconn.ssl_in_use
        assert client_row(p, application_name="direct")["addr"] == CLIENT[0]


def test_a_cancel_request_after_a_header(pooler: Callable[..., Pooler],
                                         balancers: Callable[..., Balancer]) -> None:
    p = behind(pooler)
    balancer = balancers(p)
    with connect(balancer.port) as conn:
        errors: list[BaseException] = []

        def sleep() -> None:
            try:
                conn.execute("SELECT pg_sleep(20)")
            except psycopg.Error as exc:
                errors.append(exc)

        sleeper = threading.Thread(target=sleep)
        sleeper.start()
        assert wait_for(lambda: any(r["state"] == "active" for r in clients(p)), 5)
        conn.cancel_safe(timeout=5)  # a new connection through the balancer, header first
        sleeper.join(10)
        assert not sleeper.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], psycopg.errors.QueryCanceled), errors
        assert conn.execute("SELECT 2").fetchone() == (2,)


# --- refused -------------------------------------------------------------------------------


def test_a_trusted_source_without_a_header_is_refused(pooler: Callable[..., Pooler]) -> None:
    p = behind(pooler, **TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send_startup({"user": APP_USER, "database": "app"})
        assert refused(raw) == "no PROXY protocol header from a proxy_protocol_sources address"
    # (sslmode=prefer's SSLRequest would get the error, which libpq reports in its own words)
    with pytest.raises(psycopg.OperationalError, match="no PROXY protocol header"):
        connect(p.port, sslmode="disable")
    assert ("pooler error: no PROXY protocol header from a proxy_protocol_sources address"
            in p.log())


def test_a_header_from_an_untrusted_source_is_refused(pooler: Callable[..., Pooler],
                                                      balancers: Callable[..., Balancer]) -> None:
    # 127.0.0.1, where the tests connect from, is not a source here.
    p = pooler({**TRUST, "proxy_protocol_sources": "127.0.0.2, 2001:db8::/32"})
    for header in (proxy_v1(CLIENT, ("127.0.0.1", p.port)), proxy_v2(CLIENT), proxy_v2(None)):
        with RawClient(p.host, p.port) as raw:
            raw.send(header)
            assert refused(raw) == ("PROXY protocol header from an address not in "
                                    "proxy_protocol_sources")
    with pytest.raises(psycopg.OperationalError, match="not in proxy_protocol_sources"):
        connect(balancers(p).port, sslmode="disable")
    assert "127.0.0.1:" in p.log() and "not in proxy_protocol_sources" in p.log()
    # Without a header, a client from elsewhere logs in as ever, with its own address.
    with connect(p.port, "plain") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert client_row(p, application_name="plain")["addr"] == "127.0.0.1"


def test_a_broken_header_is_refused(pooler: Callable[..., Pooler]) -> None:
    p = behind(pooler, **TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send(b"PROXY TCP4 203.0.113.5 198.51.100.1 99999 6432\r\n")
        assert "bad port in PROXY v1 header" in refused(raw)
    with RawClient(p.host, p.port) as raw:
        raw.send(b"PROXY TCP4 " + b"9" * 200)
        assert "longer than 107 bytes" in refused(raw)


def test_a_silent_balancer_is_closed_at_the_login_timeout(pooler: Callable[..., Pooler]) -> None:
    p = behind(pooler, client_login_timeout="1", **TRUST)
    with RawClient(p.host, p.port) as raw:
        started = time.monotonic()
        raw.send(proxy_v2(CLIENT)[:20])  # half a header, then nothing
        assert raw.is_closed()
        assert time.monotonic() - started < 5


def test_off_by_default_a_header_is_a_bad_startup_packet(pooler: Callable[..., Pooler]) -> None:
    p = pooler(TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send(proxy_v1(CLIENT, ("127.0.0.1", p.port)))
        assert refused(raw).startswith("bad packet header")
    with RawClient(p.host, p.port) as raw:
        login = raw.login(APP_USER, "app")
        assert login.error is None
        assert raw.simple_query("SELECT 1")[2] == m.TX_IDLE


def test_a_reload_changes_the_sources_for_new_connections(pooler: Callable[..., Pooler]) -> None:
    p = behind(pooler, **TRUST)
    with RawClient(p.host, p.port) as raw:
        raw.send(proxy_v2(CLIENT))
        assert raw.login(APP_USER, "app").error is None
        p.rewrite_config({"proxy_protocol_sources": ""})
        p.reload()

        def plain_login() -> bool:
            try:
                with RawClient(p.host, p.port) as plain:
                    return plain.login(APP_USER, "app").error is None
            except EOFError:
                return False

        assert wait_for(plain_login, 10)
        # The connection made before the reload goes on.
        assert raw.simple_query("SELECT 1")[0] == [["1"]]


def test_set_checks_and_changes_the_sources(pooler: Callable[..., Pooler]) -> None:
    p = pooler(TRUST)
    with psycopg.connect(host=str(p.ini_path.parent), port=p.port, user=ADMIN_USER,
                         password=ADMIN_PASSWORD, dbname="pgbouncer", autocommit=True,
                         prepare_threshold=None, connect_timeout=5) as admin:
        with pytest.raises(psycopg.Error, match="SET failed"):
            admin.execute("SET proxy_protocol_sources = '10.0.0.0/8, balancer.example'")
        admin.execute("SET proxy_protocol_sources = '127.0.0.0/8'")
        with RawClient(p.host, p.port) as raw:
            raw.send(proxy_v1(CLIENT, ("127.0.0.1", p.port)))
            assert raw.login(APP_USER, "app", application_name="after-set").error is None
            assert client_row(p, application_name="after-set")["addr"] == CLIENT[0]
    assert "not an IP address or network: 'balancer.example'" in p.log()


# --- peers ---------------------------------------------------------------------------------


def test_a_cancel_forwarded_between_peers_opens_with_a_local_header(
        postgres: Any, pooler: Callable[..., Pooler], balancers: Callable[..., Balancer]) -> None:
    """Two [peers] by TCP on 127.0.0.1, which is also in their proxy_protocol_sources (one
    ini for both, the balancer's network): a cancel that reaches the wrong instance through
    the balancer is forwarded to the owner with a v2 LOCAL header, which the owner requires
    from that address, and cancels the query there."""
    from .test_peers import SlowQuery, running, send_cancel

    keys = {"proxy_protocol_sources": "127.0.0.1", "auth_type": "trust"}
    one = pooler({**keys, "peer_id": "1"})
    two = pooler({**keys, "peer_id": "2"},
                 extra_sections=f"[peers]\n1 = host=127.0.0.1 port={one.port}\n")
    to_one, to_two = balancers(one), balancers(two)

    class Through:  # SlowQuery's pooler, reached through the balancer
        host, port = "127.0.0.1", to_one.port

    query = SlowQuery(Through, 10)  # type: ignore[arg-type]
    query.start()
    assert wait_for(lambda: running(postgres) == 1, 5)
    send_cancel("127.0.0.1", to_two.port, query.key)
    query.join(5)
    assert query.sqlstate == "57014", two.log()  # query_canceled
    assert "PROXY protocol header" not in one.log()  # nothing was refused
