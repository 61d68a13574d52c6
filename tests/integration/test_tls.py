"""TLS from clients to pypool (client_tls_*), against real client libraries.

A throwaway CA (tls_ca.py) signs pypool's certificate, for `localhost` and 127.0.0.1, and a
client certificate for user `app`; a second CA is the wrong one. Server-side TLS, to a
PostgreSQL with ssl = on, is tests/integration/test_tls_server.py.
"""

from __future__ import annotations

import re
import ssl
import struct
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
from scramp import ScramClient

from pypool.auth.channel_binding import tls_server_end_point
from pypool.embedded import free_port
from pypool.protocol import messages as m
from tests.conftest import ADMIN_PASSWORD, ADMIN_USER, APP_PASSWORD, APP_USER, Pooler

from .node_clients import node_pg
from .polling import wait_for
from .rawclient import SSL_REQUEST, RawClient, TlsRawClient
from .tls_ca import Certificates, certs, tls_settings

pytestmark = pytest.mark.timeout(60)

def connect(p: Pooler, user: str = APP_USER, password: str = APP_PASSWORD,
            dbname: str = "app", host: str | None = None, **params: Any) -> psycopg.Connection:
    return psycopg.connect(host=host or p.host, port=p.port, user=user, password=password,
                           dbname=dbname, connect_timeout=5, autocommit=True, **params)


def show(p: Pooler, what: str) -> list[dict[str, Any]]:
    # Over the unix socket, which no client_tls_sslmode refuses.
    with connect(p, ADMIN_USER, ADMIN_PASSWORD, "pgbouncer", host=str(p.ini_path.parent),
                 prepare_threshold=None) as admin:
        cur = admin.execute(f"SHOW {what}")
        names = [c.name for c in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def my_client_row(p: Pooler, application_name: str) -> dict[str, Any]:
    [row] = [r for r in show(p, "CLIENTS") if r["application_name"] == application_name]
    return row


__all__ = ["certs", "node_pg"]  # the fixtures (certs is shared with test_tls_server.py)

TLS_INFO = re.compile(r"^TLSv1\.[23]/[A-Z0-9_-]+/ECDH=[A-Za-z0-9_-]+$")  # PgBouncer's form


# --- sslmode, each as libpq asks ------------------------------------------------------------


@pytest.mark.parametrize(
    ("sslmode", "encrypted"),
    [("disable", False), ("allow", False), ("prefer", True), ("require", True),
     ("verify-ca", True), ("verify-full", True)],
)
def test_psycopg_each_sslmode(pooler: Callable[..., Pooler], certs: Certificates,
                              sslmode: str, encrypted: bool) -> None:
    p = pooler(tls_settings(certs))
    name = f"mode-{sslmode}"
    with connect(p, host="localhost", sslmode=sslmode, sslrootcert=str(certs.ca.root),
                 application_name=name) as conn:
        assert conn.execute("SELECT 6 * 7").fetchone() == (42,)
        assert conn.pgconn.ssl_in_use is encrypted
        tls = my_client_row(p, name)["tls"]
        assert TLS_INFO.match(tls) if encrypted else tls == "", tls
    if encrypted:
        assert "tls=TLSv1.3/" in p.log()


NODE_TLS_SCRIPT = """
const fs = require('fs');
const { Client } = require('pg');
const [host, port, user, password, ca] = process.argv.slice(2);
const client = new Client({
  host, port: Number(port), user, password, database: 'app', application_name: 'node-tls',
  ssl: { ca: fs.readFileSync(ca), servername: 'localhost', rejectUnauthorized: true },
});
client.connect()
  .then(() => client.query('SELECT 6 * 7 AS v'))
  .then((r) => { console.log(JSON.stringify(r.rows[0].v)); return client.end(); })
  .catch((e) => { console.error(e); process.exit(1); });
"""


def test_node_postgres_with_ssl(pooler: Callable[..., Pooler], certs: Certificates,
                                node_pg: Path) -> None:
    """node-postgres with `ssl` (it checks the certificate against the CA, for localhost)
    logs in over TLS; a client that trusts only the wrong CA is refused by its own check."""
    p = pooler(tls_settings(certs, "require"))
    script = node_pg / "tls.js"
    script.write_text(NODE_TLS_SCRIPT)
    args = ["node", str(script), "127.0.0.1", str(p.port), APP_USER, APP_PASSWORD]
    done = subprocess.run([*args, str(certs.ca.root)], cwd=node_pg, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr + p.log()[-2000:]
    assert done.stdout.strip() == "42"
    assert "tls=TLSv1." in p.log()
    wrong = subprocess.run([*args, str(certs.other_ca.root)], cwd=node_pg,
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode != 0
    assert "certificate" in wrong.stderr.lower(), wrong.stderr


def test_the_wrong_root_fails_verify_ca(pooler: Callable[..., Pooler],
                                        certs: Certificates) -> None:
    p = pooler(tls_settings(certs))
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        connect(p, sslmode="verify-ca", sslrootcert=str(certs.other_ca.root))


def test_require_refuses_a_plaintext_login(pooler: Callable[..., Pooler],
                                           certs: Certificates) -> None:
    p = pooler(tls_settings(certs, "require"))
    with pytest.raises(psycopg.OperationalError) as info:
        connect(p, sslmode="disable")
    assert "SSL required" in str(info.value)
    with connect(p, sslmode="require") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    # The unix socket never does TLS and is not refused (PgBouncer's rule).
    with connect(p, host=str(p.ini_path.parent), sslmode="disable") as conn:
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_disable_answers_n(pooler: Callable[..., Pooler], certs: Certificates) -> None:
    p = pooler(tls_settings(certs, "disable"))
    with pytest.raises(psycopg.OperationalError, match="does not support SSL"):
        connect(p, sslmode="require")
    with connect(p, sslmode="prefer") as conn:
        assert conn.pgconn.ssl_in_use is False


async def test_asyncpg_with_an_ssl_context(pooler: Callable[..., Pooler],
                                           certs: Certificates) -> None:
    p = pooler(tls_settings(certs, "require"))
    context = ssl.create_default_context(cafile=str(certs.ca.root))
    conn = await asyncpg.connect(host="localhost", port=p.port, user=APP_USER,
                                 password=APP_PASSWORD, database="app", ssl=context,
                                 statement_cache_size=0, timeout=5)
    try:
        assert await conn.fetchval("SELECT 40 + $1::int", 2) == 42
        assert conn._transport.get_extra_info("ssl_object") is not None  # noqa: SLF001
    finally:
        await conn.close()


# --- SCRAM-SHA-256-PLUS ---------------------------------------------------------------------


def test_channel_binding_require_logs_in(pooler: Callable[..., Pooler],
                                         certs: Certificates) -> None:
    p = pooler(tls_settings(certs))
    with connect(p, sslmode="require", channel_binding="require") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    # Without TLS there is no binding to offer, and libpq refuses to go on.
    with pytest.raises(psycopg.OperationalError, match="channel binding"):
        connect(p, sslmode="disable", channel_binding="require")


def scram_login(raw: RawClient, client: ScramClient, mechanism: str) -> tuple[int, bytes]:
    """SASL with `client` over `raw` up to the pooler's reply to client-final-message."""
    raw.send_startup({"user": APP_USER, "database": "app"})
    kind, body = raw.read_message() or (0, b"")
    assert kind == m.AUTHENTICATION and body[:4] == struct.pack("!I", m.AUTH_SASL), body
    offered = m.parse_sasl_mechanisms(body[4:])
    assert offered == ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]
    raw.send(m.sasl_initial_response(mechanism, client.get_client_first().encode()))
    kind, body = raw.read_message() or (0, b"")
    if kind != m.AUTHENTICATION:
        return kind, body
    client.set_server_first(body[4:].decode())
    raw.send(m.password_message(client.get_client_final().encode()))
    return raw.read_message() or (0, b"")


def test_a_binding_that_does_not_match_fails(pooler: Callable[..., Pooler],
                                             certs: Certificates) -> None:
    p = pooler(tls_settings(certs))
    # The binding of another certificate: what a man in the middle would have.
    wrong = tls_server_end_point(ssl.PEM_cert_to_DER_cert(certs.other_server.cert.read_text()))
    assert wrong is not None
    with TlsRawClient(p.host, p.port, certs.ca.root) as raw:
        client = ScramClient(["SCRAM-SHA-256-PLUS"], APP_USER, APP_PASSWORD,
                             channel_binding=("tls-server-end-point", wrong))
        kind, body = scram_login(raw, client, "SCRAM-SHA-256-PLUS")
        assert kind == m.ERROR_RESPONSE
        fields = m.parse_error_fields(body)
        assert (fields["C"], fields["M"]) == ("08P01", "SCRAM channel binding check failed")
    # The right binding, computed from the certificate the pooler presented, logs in.
    with TlsRawClient(p.host, p.port, certs.ca.root) as raw:
        client = ScramClient(["SCRAM-SHA-256-PLUS"], APP_USER, APP_PASSWORD,
                             channel_binding=("tls-server-end-point", raw.sock))  # type: ignore[arg-type]
        kind, body = scram_login(raw, client, "SCRAM-SHA-256-PLUS")
        assert kind == m.AUTHENTICATION and body[:4] == struct.pack("!I", m.AUTH_SASL_FINAL)
        client.set_server_final(body[4:].decode())  # the pooler proved itself too
        raw.read_until(m.READY_FOR_QUERY)


def test_a_downgraded_offer_is_refused(pooler: Callable[..., Pooler],
                                       certs: Certificates) -> None:
    # `y`: the client can bind but believes the server cannot, so someone removed -PLUS
    # from the offer. Over TLS, where the pooler did offer it, that fails the login.
    p = pooler(tls_settings(certs))
    with TlsRawClient(p.host, p.port, certs.ca.root) as raw:
        raw.send_startup({"user": APP_USER, "database": "app"})
        raw.read_message()
        raw.send(m.sasl_initial_response("SCRAM-SHA-256", b"y,,n=,r=abcdefghijkl"))
        kind, body = raw.read_message() or (0, b"")
        assert kind == m.ERROR_RESPONSE
        fields = m.parse_error_fields(body)
        assert fields["C"] == "28000"
        assert fields["M"].startswith("SCRAM channel binding negotiation error")


# --- client certificates --------------------------------------------------------------------


def test_client_certificate_login(pooler: Callable[..., Pooler], certs: Certificates) -> None:
    p = pooler(tls_settings(certs, "verify-full", auth_type="cert"))
    with connect(p, host="localhost", password="", sslmode="verify-full",
                 sslrootcert=str(certs.ca.root), sslcert=str(certs.client.cert),
                 sslkey=str(certs.client.key)) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (APP_USER,)
    # The certificate names `app`: no other user logs in with it.
    with pytest.raises(psycopg.OperationalError) as info:
        connect(p, user=ADMIN_USER, dbname="app", password="", sslmode="require",
                sslcert=str(certs.client.cert), sslkey=str(certs.client.key))
    assert "certificate authentication failed" in str(info.value)
    assert "TLS certificate name mismatch" in p.log()
    # verify-full asks for a certificate: none, or one from another CA, fails the handshake.
    for cert in (None, certs.other_client):
        with pytest.raises(psycopg.OperationalError):
            connect(p, password="", sslmode="require",
                    **({} if cert is None else {"sslcert": str(cert.cert),
                                                "sslkey": str(cert.key)}))


def test_cert_auth_needs_verify_full(pooler: Callable[..., Pooler], certs: Certificates,
                                     tmp_path: Path) -> None:
    p = pooler(tls_settings(certs, "verify-full", auth_type="cert"))
    p.rewrite_config({"client_tls_sslmode": "require"})
    p.reload()
    assert wait_for(lambda: "auth_type=cert requires client_tls_sslmode=verify-full"
                    in p.log(), 5), p.log()


# --- the buffering attack (CVE-2021-23222) --------------------------------------------------


def test_bytes_behind_the_ssl_request_are_refused(pooler: Callable[..., Pooler],
                                                  certs: Certificates) -> None:
    p = pooler(tls_settings(certs))
    startup = struct.pack("!I", 196608) + m.cstring("user") + m.cstring(APP_USER) + b"\x00"
    startup = struct.pack("!I", len(startup) + 4) + startup
    with RawClient(p.host, p.port) as raw:
        raw.send(SSL_REQUEST + startup)  # injected before the handshake
        fields = raw.read_error_and_close()
        assert (fields["C"], fields["M"]) == ("08P01",
                                              "received unencrypted data after SSL request")
    # After 'S', plaintext is no ClientHello: the handshake fails and nothing is served.
    with RawClient(p.host, p.port) as raw:
        raw.send(SSL_REQUEST)
        assert raw.read_bytes(1) == b"S"
        raw.send(startup + m.query("SELECT 1"))
        assert raw.is_closed()
    assert wait_for(lambda: "TLS handshake failed" in p.log(), 5), p.log()
    with connect(p, sslmode="require") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


# --- reload: certificate rotation -----------------------------------------------------------


def test_reload_rotates_the_certificate_and_keeps_it_on_a_bad_file(
        pooler: Callable[..., Pooler], certs: Certificates, tmp_path: Path) -> None:
    cert, key = tmp_path / "pooler.crt", tmp_path / "pooler.key"
    cert.write_bytes(certs.server.cert.read_bytes())
    key.write_bytes(certs.server.key.read_bytes())
    p = pooler(tls_settings(certs, client_tls_cert_file=str(cert), client_tls_key_file=str(key)))
    old_root, new_root = str(certs.ca.root), str(certs.other_ca.root)
    kept = connect(p, host="localhost", sslmode="verify-full", sslrootcert=old_root)
    # Rotate: same paths, new files; SIGHUP.
    cert.write_bytes(certs.other_server.cert.read_bytes())
    key.write_bytes(certs.other_server.key.read_bytes())
    p.reload()

    def rotated() -> bool:
        try:
            connect(p, host="localhost", sslmode="verify-full", sslrootcert=new_root).close()
            return True
        except psycopg.OperationalError:
            return False
    assert wait_for(rotated, 5), p.log()
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        connect(p, host="localhost", sslmode="verify-full", sslrootcert=old_root)
    assert kept.execute("SELECT 'still here'").fetchone() == ("still here",)  # nobody dropped
    # A broken key file: logged, and the certificate in force stays.
    key.write_text("not a key\n")
    p.reload()
    assert wait_for(lambda: "TLS setup failed: " in p.log()
                    and "keeping the TLS configuration in force" in p.log(), 5), p.log()
    # The console's RELOAD says it failed, in PgBouncer 1.25's words.
    with connect(p, ADMIN_USER, ADMIN_PASSWORD, "pgbouncer", host=str(p.ini_path.parent),
                 prepare_threshold=None) as admin:
        with pytest.raises(psycopg.errors.ConfigFileError,
                           match="RELOAD failed, see logs for additional details"):
            admin.execute("RELOAD")
    with connect(p, host="localhost", sslmode="verify-full", sslrootcert=new_root) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    kept.close()


def test_set_turns_tls_on_and_off(pooler: Callable[..., Pooler], certs: Certificates) -> None:
    # As PgBouncer's test_client_ssl_set_enable_disable: the files first, then the mode.
    p = pooler()
    with connect(p, ADMIN_USER, ADMIN_PASSWORD, "pgbouncer", prepare_threshold=None) as admin:
        for key, value in tls_settings(certs, "require").items():
            admin.execute(f"SET {key} = '{value}'")
        with connect(p, host="localhost", sslmode="verify-full",
                     sslrootcert=str(certs.ca.root)) as conn:
            assert conn.pgconn.ssl_in_use
        admin.execute("SET client_tls_sslmode = disable")
        with connect(p, sslmode="prefer") as conn:
            assert conn.pgconn.ssl_in_use is False


# --- metrics --------------------------------------------------------------------------------


def test_handshakes_are_counted(pooler: Callable[..., Pooler], certs: Certificates) -> None:
    port = free_port()
    p = pooler(tls_settings(certs, metrics_port=str(port)))
    with connect(p, sslmode="require"):
        pass
    with RawClient(p.host, p.port) as raw:
        raw.send(SSL_REQUEST)
        assert raw.read_bytes(1) == b"S"
        raw.send(b"\x16\x03\x01\x00\x05hello")  # a broken ClientHello
        assert raw.is_closed()

    def counts() -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        found = {}
        for line in text.decode().splitlines():
            match = re.match(r'pypool_tls_handshakes_total\{outcome="(\w+)",side="(\w+)"\} (\S+)',
                             line)
            if match:
                found[f"{match[2]}/{match[1]}"] = float(match[3])
        return found
    assert wait_for(lambda: counts().get("client/failed") == 1.0, 5), counts()
    assert counts()["client/ok"] == 1.0


# --- direct TLS (PostgreSQL 17's sslnegotiation=direct) -------------------------------------


@pytest.mark.skipif(psycopg.pq.version() < 170000, reason="libpq 17 brought direct TLS")
def test_direct_tls_with_alpn(pooler: Callable[..., Pooler], certs: Certificates) -> None:
    p = pooler(tls_settings(certs, "require"))
    with connect(p, host="localhost", sslmode="verify-full", sslrootcert=str(certs.ca.root),
                 sslnegotiation="direct", channel_binding="require",
                 application_name="direct") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.pgconn.ssl_in_use
        assert TLS_INFO.match(my_client_row(p, "direct")["tls"])
    # libpq's usual way still works beside it.
    with connect(p, sslmode="require", sslnegotiation="postgres") as conn:
        assert conn.pgconn.ssl_in_use


def test_direct_tls_without_alpn_is_refused(pooler: Callable[..., Pooler],
                                            certs: Certificates) -> None:
    p = pooler(tls_settings(certs, "require", auth_type="trust"))
    context = ssl.create_default_context(cafile=str(certs.ca.root))  # no ALPN offered
    with RawClient(p.host, p.port) as raw:
        raw.sock = context.wrap_socket(raw.sock, server_hostname="localhost")
        fields = raw.read_error_and_close()
        assert (fields["C"], fields["M"]) == (
            "08P01", "received direct SSL connection request without ALPN protocol "
                     "negotiation extension")
    # With ALPN `postgresql` the same raw client is served.
    context.set_alpn_protocols(["postgresql"])
    with RawClient(p.host, p.port) as raw:
        raw.sock = context.wrap_socket(raw.sock, server_hostname="localhost")
        assert raw.login(APP_USER, "app").error is None
        assert raw.simple_query("SELECT 'direct'")[0] == [["direct"]]


def test_cancel_inside_tls_and_in_plaintext(pooler: Callable[..., Pooler],
                                            certs: Certificates) -> None:
    # libpq 17's cancel (psycopg's cancel_safe) opens TLS as the connection did; the old
    # PQcancel sends it in plaintext, which require still accepts, as PgBouncer.
    p = pooler(tls_settings(certs, "require"))
    for cancel in ("cancel_safe", "cancel"):
        with connect(p, sslmode="require") as conn:
            timer = threading.Timer(0.5, getattr(conn, cancel))
            timer.start()
            try:
                with pytest.raises(psycopg.errors.QueryCanceled):
                    conn.execute("SELECT pg_sleep(10)")
            finally:
                timer.cancel()
            assert conn.execute("SELECT 1").fetchone() == (1,)


class RecordWatchingTls:
    """A TLS client socket over memory BIOs that notes the length of each record as it
    comes off the wire (the record header is in the clear), for RawClient's `sock`."""

    def __init__(self, sock: Any, root: Path, alpn: bool = False) -> None:
        context = ssl.create_default_context(cafile=str(root))
        if alpn:
            context.set_alpn_protocols(["postgresql"])  # direct TLS must name it
        self.raw = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")
        self.unparsed = b""
        self.data_records: list[int] = []  # lengths of application-data records (type 23)
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._receive()
        self._flush()

    def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            self.raw.sendall(data)

    def _receive(self) -> None:
        chunk = self.raw.recv(65536)
        if not chunk:
            raise EOFError("the pooler closed the connection")
        self.unparsed += chunk
        while len(self.unparsed) >= 5:
            length = int.from_bytes(self.unparsed[3:5], "big")
            if len(self.unparsed) < 5 + length:
                break
            if self.unparsed[0] == 23:
                self.data_records.append(length)
            self.unparsed = self.unparsed[5 + length:]
        self.incoming.write(chunk)

    def sendall(self, data: bytes) -> None:
        self.tls.write(data)
        self._flush()

    def recv(self, size: int) -> bytes:
        while True:
            try:
                return self.tls.read(size)
            except ssl.SSLWantReadError:
                self._flush()
                self._receive()

    def close(self) -> None:
        self.raw.close()


@pytest.mark.parametrize("start", ["sslrequest", "direct"])
def test_records_to_clients_carry_at_most_8_kib(pooler: Callable[..., Pooler],
                                                certs: Certificates, start: str) -> None:
    # PostgreSQL's records are at most its 8 KiB send buffer, and libpq relies on it: a
    # larger record's tail can stay inside the client's OpenSSL while libpq waits on the
    # socket (pg_basebackup -X stream hung so at the end of its WAL stream). Both ways into
    # TLS: after an SSLRequest (uvloop's TLS layer) and direct (asyncio's).
    p = pooler(tls_settings(certs, auth_type="trust"))
    with RawClient(p.host, p.port) as raw:
        if start == "sslrequest":
            raw.send(SSL_REQUEST)
            assert raw.read_bytes(1) == b"S"
        watched = RecordWatchingTls(raw.sock, certs.ca.root, alpn=start == "direct")
        raw.sock = watched  # type: ignore[assignment]
        assert raw.login(APP_USER, "app").error is None
        rows, tag, _ = raw.simple_query("SELECT repeat('x', 300000)")
        assert tag == "SELECT 1" and rows == [["x" * 300000]]
    # 300 KB went by; each record's ciphertext is its plaintext, the inner content type
    # and the 16-byte tag of TLS 1.3's AEAD.
    assert sum(watched.data_records) > 300000
    assert max(watched.data_records) <= 8192 + 17, sorted(watched.data_records)[-5:]
