"""The login phase under hostile input, on raw sockets against a real pooler: malformed SCRAM,
bad startup packets, messages out of place, oversized headers before authentication,
protocol negotiation, and a bounded fuzz run. Each case ends in an ErrorResponse (FATAL)
and a closed connection, a WARNING in the log, and a pooler that still serves others."""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Callable

import psycopg
import pytest

from pypool.protocol import messages as m

from .polling import wait_for
from .rawclient import SSL_REQUEST, QueryError, RawClient

pytestmark = pytest.mark.timeout(60)

APP, APP_PW = "app", "app-secret"


def still_serves(p) -> None:  # type: ignore[no-untyped-def]
    """A normal client can log in through the pooler `p` and run a query."""
    with psycopg.connect(p.dsn(), connect_timeout=5) as conn:
        assert conn.execute("SELECT 40 + 2").fetchone() == (42,)


def warned(p, pattern: str) -> bool:  # type: ignore[no-untyped-def]
    """A WARNING line matching `pattern` reaches the log within a few seconds (so `-q`,
    which hides INFO, still shows it)."""
    line = re.compile(r" WARNING .*" + pattern)
    return wait_for(lambda: any(line.search(x) for x in p.log().splitlines()), 5)


def sasl_start(raw: RawClient, user: str = APP) -> None:
    """Send the startup packet and read up to AuthenticationSASL."""
    raw.send_startup({"user": user, "database": "app"})
    kind, body = raw.read_until(m.AUTHENTICATION)[-1]
    assert m.parse_authentication(body)[0] == m.AUTH_SASL


# --- SCRAM: what PostgreSQL and PgBouncer refuse --------------------------------------------


@pytest.mark.parametrize(
    ("first", "text"),
    [
        (b"n,a=postgres,n=,r=abcdefgh", "authorization identity"),
        (b"n,,m=ext,n=,r=abcdefgh", "unsupported SCRAM extension"),
    ],
)
def test_client_first_with_authzid_or_mandatory_extension_is_refused(
    pooler: Callable, first: bytes, text: str
) -> None:
    p = pooler()
    with RawClient(p.host, p.port) as raw:
        sasl_start(raw)
        raw.send(m.sasl_initial_response("SCRAM-SHA-256", first))
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "08P01")
    assert text in error["M"]
    assert warned(p, text)
    still_serves(p)


@pytest.mark.parametrize("length", [5, 200, -1])
def test_sasl_initial_response_length_that_does_not_match_is_refused(
    pooler: Callable, length: int
) -> None:
    p = pooler()
    data = b"n,,n=,r=abcdefgh"
    with RawClient(p.host, p.port) as raw:
        sasl_start(raw)
        body = m.cstring("SCRAM-SHA-256") + struct.pack("!i", length) + data
        raw.send(m.message(m.PASSWORD_MESSAGE, body))
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "08P01")
    assert warned(p, "SASLInitialResponse")
    still_serves(p)


def test_sasl_initial_response_without_data_gets_an_empty_challenge(pooler: Callable) -> None:
    # Length -1 and nothing after it: as PostgreSQL, ask for the client-first-message with
    # an empty AuthenticationSASLContinue; it then comes as a SASLResponse.
    p = pooler()
    with RawClient(p.host, p.port) as raw:
        sasl_start(raw)
        raw.send(m.message(m.PASSWORD_MESSAGE, m.cstring("SCRAM-SHA-256") + b"\xff" * 4))
        kind, body = raw.read_message() or (0, b"")
        assert (kind, m.parse_authentication(body)) == (m.AUTHENTICATION,
                                                       (m.AUTH_SASL_CONTINUE, b""))
        raw.send(m.password_message(b"n,,n=,r=abcdefgh"))
        kind, body = raw.read_message() or (0, b"")
        code, payload = m.parse_authentication(body)
        assert code == m.AUTH_SASL_CONTINUE and payload.startswith(b"r=abcdefgh")


def test_unknown_sasl_mechanism_is_refused(pooler: Callable) -> None:
    # PostgreSQL and PgBouncer say 08P01 "client selected an invalid SASL authentication
    # mechanism"; pypool keeps its 28P01 (tests/integration/test_bad_input.py pins it).
    p = pooler()
    with RawClient(p.host, p.port) as raw:
        sasl_start(raw)
        raw.send(m.sasl_initial_response("SCRAM-SHA-1", b"n,,n=,r=abcdefgh"))
        error = raw.read_error_and_close()
    assert (error["S"], error["C"], error["M"]) == ("FATAL", "28P01", "SASL authentication failed")
@pytest.mark.parametrize(
    ("auth_type", "user", "text"),
    [
        ("scram-sha-256", APP, "SASL authentication failed"),
        ("scram-sha-256", "ghost", "SASL authentication failed"),  # unknown user
        ("md5", APP, "password authentication failed"),
        ("plain", "ghost", "password authentication failed"),
    ],
)
def test_failed_login_stays_28p01_and_is_logged_as_a_warning(
    pooler: Callable, auth_type: str, user: str, text: str
) -> None:
    p = pooler({"auth_type": auth_type})
    with pytest.raises(psycopg.OperationalError, match=text):
        psycopg.connect(p.dsn(user=user, password="wrong"), connect_timeout=5)
    assert warned(p, text + r" \(28P01\)")


# --- the startup packet ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        struct.pack("!II", 4, 196608) + b"user\x00app\x00\x00",  # shorter than its header
        struct.pack("!II", 10001, 196608) + b"user\x00app\x00\x00",  # MAX_STARTUP_PACKET + 1
        struct.pack("!II", 0x7FFFFFFF, 196608),
        b"GET / HTTP/1.1\r\nHost: example\r\n\r\n",
    ],
)
def test_bad_startup_header_gets_fatal_bad_packet_header(pooler: Callable, data: bytes) -> None:
    # PgBouncer answers these with "bad packet header: '<hex>'"; pypool closed silently.
    p = pooler({"auth_type": "trust"})
    with RawClient(p.host, p.port) as raw:
        raw.send(data)
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "08P01")
    assert error["M"] == f"bad packet header: '{data[:8].hex()}'"
    assert warned(p, "bad packet header")
    still_serves(p)


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (m.password_message(m.cstring(APP_PW)), "client password pkt before startup packet"),
        (m.query("SELECT 1"), "unexpected message type 'Q' before startup packet"),
    ],
)
def test_message_before_startup_gets_fatal(pooler: Callable, data: bytes, text: str) -> None:
    p = pooler()
    with RawClient(p.host, p.port) as raw:
        raw.send(data)
        error = raw.read_error_and_close()
    assert (error["S"], error["C"], error["M"]) == ("FATAL", "08P01", text)
    still_serves(p)


# --- what an unauthenticated client may make the pooler buffer ------------------------------


@pytest.mark.parametrize("auth_type", ["scram-sha-256", "md5", "plain"])
def test_huge_password_header_is_refused_before_its_body(pooler: Callable, auth_type: str) -> None:
    # Announcing a 1 GiB password used to make the pooler buffer all of it (four 2 GiB ones
    # took it to 1.5 GiB); PostgreSQL caps auth packets at 65535 bytes.
    p = pooler({"auth_type": auth_type})
    with RawClient(p.host, p.port, timeout=5) as raw:
        raw.send_startup({"user": APP, "database": "app"})
        raw.read_until(m.AUTHENTICATION)
        raw.send(b"p" + struct.pack("!I", 1 << 30) + b"x" * 60000)
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "08P01")
    assert error["M"].startswith("password packet too long")
    assert warned(p, "password packet too long")
    still_serves(p)


def test_password_at_the_limit_is_still_read(pooler: Callable) -> None:
    # 65535 bytes of body is allowed; it is just a wrong password.
    p = pooler({"auth_type": "plain"})
    with RawClient(p.host, p.port, timeout=5) as raw:
        raw.send_startup({"user": APP, "database": "app"})
        raw.read_until(m.AUTHENTICATION)
        raw.send(m.password_message(b"x" * 65534 + b"\x00"))
        error = raw.read_error_and_close()
    assert (error["C"], error["M"]) == ("28P01", "password authentication failed")


def test_second_startup_packet_while_auth_query_runs_is_refused(
    pooler: Callable, postgres  # type: ignore[no-untyped-def]
) -> None:
    # While auth_query looked up the first user, a second StartupMessage was read as a new
    # login: the pooler then asked for the first user's password under the second user's
    # name. PgBouncer: "client re-sent startup pkt".
    p = pooler({"auth_user": "pool_admin"}, userlist={"pool_admin": "admin-secret"})
    with RawClient(p.host, p.port, timeout=5) as raw:
        raw.send(m.startup_message({"user": APP, "database": "app"})
                 + m.startup_message({"user": postgres.superuser, "database": "app"}))
        error = raw.read_error_and_close()
    assert (error["S"], error["C"], error["M"]) == ("FATAL", "08P01",
                                                   "client re-sent startup pkt")
    still_serves(p)


def test_bytes_held_while_auth_query_runs_are_capped(pooler: Callable) -> None:
    p = pooler({"auth_user": "pool_admin"}, userlist={"pool_admin": "admin-secret"})
    with RawClient(p.host, p.port, timeout=5) as raw:
        raw.send(m.startup_message({"user": APP, "database": "app"})
                 + b"p" + struct.pack("!I", 1 << 30) + b"x" * 70000)
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "08P01")
    still_serves(p)


# --- protocol negotiation -------------------------------------------------------------------


def test_negotiate_protocol_version_names_3_0_and_the_unknown_options(pooler: Callable) -> None:
    # As PostgreSQL sends it: Int32 the newest version supported for the major asked for
    # (0x00030000), then the unsupported _pq_ options; the login then goes on in 3.0.
    p = pooler({"auth_type": "trust"})
    with RawClient(p.host, p.port) as raw:
        raw.send(m.startup_message({"user": APP, "database": "app", "_pq_.foo": "1"}, minor=2))
        kind, body = raw.read_message() or (0, b"")
        assert kind == m.NEGOTIATE_PROTOCOL_VERSION
        version, count = struct.unpack_from("!II", body)
        assert (hex(version), count) == ("0x30000", 1)
        assert body[8:] == b"_pq_.foo\x00"
        kinds = [k for k, _ in raw.read_until(m.READY_FOR_QUERY)]
        assert m.ERROR_RESPONSE not in kinds and kinds[0] == m.AUTHENTICATION
        rows, _, _ = raw.simple_query("SELECT 'in 3.0'")
    assert rows == [["in 3.0"]]


def test_libpq_asking_for_the_latest_protocol_falls_back_to_3_0(pooler: Callable) -> None:
    if psycopg.pq.version() < 180000:
        pytest.skip(f"libpq {psycopg.pq.version()} has no max_protocol_version (libpq 18+)")
    p = pooler()
    with psycopg.connect(p.dsn() + "?max_protocol_version=latest", connect_timeout=5) as conn:
        assert conn.execute("SELECT 40 + 2").fetchone() == (42,)
        assert conn.pgconn.protocol_version == 3


# --- a bounded fuzz run ---------------------------------------------------------------------


def _login_corpus() -> list[bytes]:
    """Valid openings of a login, for the fuzz run to mutate."""
    startup = m.startup_message({"user": APP, "database": "app"})
    first = b"n,,n=,r=abcdefghijklmnop"
    return [
        startup,
        startup + m.sasl_initial_response("SCRAM-SHA-256", first),
        startup + m.sasl_initial_response("SCRAM-SHA-256", first)
        + m.password_message(b"c=biws,r=abcdefghijklmnop,p=" + b"A" * 44),
        startup + m.password_message(m.cstring(APP_PW)),
        SSL_REQUEST + startup,  # SSLRequest first
        m.cancel_request(1, 2),
        m.startup_message({"user": APP, "database": "app", "_pq_.x": "1"}, minor=2),
    ]


def _mutate(rng, data: bytes) -> bytes:  # type: ignore[no-untyped-def]
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        pos = rng.randrange(len(out) + 1)
        if op == 0 and out:  # flip a bit
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert random bytes
            out[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 2 and out:  # delete a run
            del out[pos : pos + rng.randint(1, 8)]
        elif op == 3:  # truncate
            del out[pos:]
        elif op == 4 and len(out) >= pos + 4:  # a length field made interesting
            out[pos : pos + 4] = struct.pack("!I", rng.choice(
                [0, 3, 4, 7, 8, 9999, 10000, 10001, 65540, 65541, 1 << 30, 0xFFFFFFFF]))
        else:  # a byte from the protocol's alphabet
            if out:
                out[rng.randrange(len(out))] = rng.choice(b"\x00\xff,=npQXSEaymr")
    return bytes(out)


def test_fuzzed_logins_leave_the_pooler_up_and_serving(pooler: Callable) -> None:
    """A few thousand mutated logins in under ten seconds: the pooler answers or closes each,
    never dies, never logs a traceback, and serves a normal client afterwards."""
    import os
    import random
    import socket
    import time

    p = pooler({"client_login_timeout": "2"})
    # Reproducible: the same inputs every run. A longer campaign sets PYPOOL_FUZZ_SEED and
    # PYPOOL_FUZZ_LOGINS (and a larger --timeout).
    rng = random.Random(int(os.environ.get("PYPOOL_FUZZ_SEED", "20261201")))
    logins = int(os.environ.get("PYPOOL_FUZZ_LOGINS", "3000"))
    corpus = _login_corpus()
    sent = 0
    deadline = time.monotonic() + 7 * max(1, logins / 3000)
    while sent < logins and time.monotonic() < deadline:
        data = _mutate(rng, rng.choice(corpus))
        with socket.create_connection((p.host, p.port), timeout=2) as sock:
            try:
                sock.sendall(data)
                if sent % 250 == 0:
                    # Now and then wait for the answer: an error, a request, or a close.
                    sock.settimeout(0.5)
                    try:
                        sock.recv(65536)
                    except TimeoutError:
                        pass
            except OSError:
                pass  # the pooler closed first: that is an answer too
        sent += 1
    assert sent >= 1000, f"only {sent} logins in the time"
    assert p.proc.poll() is None, p.log()[-3000:]
    still_serves(p)
    log = p.log()
    assert "Traceback" not in log and "Fatal error" not in log, log[-5000:]


# --- CVE classes of PgBouncer 1.25.2 and 1.26.0 ------------------------------------------


class _BareErrorServer:
    """A PostgreSQL stand-in whose ErrorResponses carry no SQLSTATE: at login
    (`at_login`), or as the answer to every Query."""

    def __init__(self, at_login: bool) -> None:
        import threading

        self.at_login = at_login
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        bare = m.message(m.ERROR_RESPONSE, b"SERROR\x00Mno sqlstate here\x00\x00")
        ready = m.message(m.READY_FOR_QUERY, b"I")
        try:
            length = struct.unpack("!I", conn.recv(4))[0]
            if struct.unpack("!I", conn.recv(length - 4)[:4])[0] == 80877103:  # SSLRequest
                conn.sendall(b"N")
                length = struct.unpack("!I", conn.recv(4))[0]
                conn.recv(length - 4)
            if self.at_login:
                fatal = b"SFATAL\x00Mno sqlstate at login\x00\x00"
                conn.sendall(m.message(m.ERROR_RESPONSE, fatal))
                return
            conn.sendall(m.message(m.AUTHENTICATION, struct.pack("!I", 0))
                         + m.message(m.PARAMETER_STATUS, b"server_version\x0017.0\x00")
                         + m.message(m.BACKEND_KEY_DATA, struct.pack("!II", 7, 7)) + ready)
            while True:
                head = conn.recv(5)
                if len(head) < 5:
                    return
                kind, length = head[:1], struct.unpack("!I", head[1:])[0]
                while length > 4:
                    length -= len(conn.recv(length - 4))
                if kind == b"X":
                    return
                if kind in (b"Q", b"S"):
                    conn.sendall(bare + ready)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("at_login", [False, True], ids=["query", "login"])
def test_an_error_response_without_sqlstate_from_a_server(
        pooler: Callable, postgres, at_login: bool) -> None:
    fake = _BareErrorServer(at_login)
    try:
        p = pooler({"auth_type": "trust"}, databases={
            "bare": f"host=127.0.0.1 port={fake.port} dbname=bare",
            "app": f"host={postgres.host} port={postgres.port} dbname=app"})
        with RawClient(p.host, p.port, timeout=10) as client:
            login = client.login("app", "bare")
            if at_login:
                assert login.error is not None
                assert "no sqlstate at login" in login.error.get("M", "")
                assert login.error.get("C")  # the client is told one: the pooler's
            else:
                assert login.error is None
                with pytest.raises(QueryError) as failed:
                    client.simple_query("SELECT 1")
                assert failed.value.fields.get("M") == "no sqlstate here"
                # The link is still whole: the next query gets its own answer.
                with pytest.raises(QueryError):
                    client.simple_query("SELECT 2")
        with RawClient(p.host, p.port, timeout=10) as other:
            assert other.login("app", "app").error is None
            assert other.simple_query("SELECT 1")[0] == [["1"]]
        assert p.proc.poll() is None
    finally:
        fake.close()


@pytest.mark.parametrize("user", ["app", "nobody"])
def test_a_client_final_message_without_a_nonce_is_refused(
        pooler: Callable, user: str) -> None:
    """CVE class of PgBouncer 1.25.2: SCRAM client-final-message with no r= attribute, for
    a user that exists and one that does not; the pooler answers with an error and goes on."""
    p = pooler()
    with RawClient(p.host, p.port, timeout=10) as client:
        client.send_startup({"user": user, "database": "app"})
        kind, _ = client.read_message()
        assert kind == m.AUTHENTICATION
        first = b"n,,n=,r=abcdefghijklmnopqrstuvwx"
        body = b"SCRAM-SHA-256\x00" + struct.pack("!i", len(first)) + first
        client.send(b"p" + struct.pack("!I", len(body) + 4) + body)
        kind, _ = client.read_message()
        assert kind == m.AUTHENTICATION  # SASLContinue
        final = b"c=biws,p=" + b"A" * 44
        client.send(b"p" + struct.pack("!I", len(final) + 4) + final)
        error = client.read_error_and_close()
        assert error["S"] == "FATAL" and error["C"] in ("08P01", "28P01")
    with RawClient(p.host, p.port, timeout=10) as other:
        other.send_startup({"user": "app", "database": "app"})
        assert other.read_message()[0] == m.AUTHENTICATION
    assert p.proc.poll() is None


@pytest.mark.parametrize("database", ["app", "no_such_database"])
def test_a_startup_packet_inside_scram_is_refused(
    pooler: Callable, postgres, database: str  # type: ignore[no-untyped-def]
) -> None:
    """PgBouncer 1.26.1's CVE-2026-107350 class: after AuthenticationSASL for one user (on a
    database that exists or not), the client sends a StartupMessage naming another user (a
    superuser, trust-free). It is never a new login: FATAL at once (a password message was
    expected), nobody is authenticated, and the pooler serves everyone else."""
    p = pooler()
    with RawClient(p.host, p.port, timeout=5) as raw:
        raw.send_startup({"user": APP, "database": database})
        kinds = [kind for kind, _ in raw.read_until(m.AUTHENTICATION)]
        assert kinds[-1] == m.AUTHENTICATION
        raw.send(m.startup_message({"user": postgres.superuser, "database": "app"}))
        error = raw.read_error_and_close()
    assert (error["S"], error["C"]) == ("FATAL", "28000"), error
    assert error["M"].startswith("expected a password message"), error
    still_serves(p)
