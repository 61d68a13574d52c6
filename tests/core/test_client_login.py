"""A client's login (core/client_login.py), run by feeding it the bytes a client sends.

`Client` plays the adapter's part (net/client.py): it runs an exchange with
`core.exchange.advance` and keeps what the pooler would have written to the socket.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
from collections.abc import Generator
from typing import TypeVar

import pytest

from pypool.auth.md5 import md5_hash, md5_response
from pypool.auth.scram import MECHANISM, ScramVerifier
from pypool.core import client_login as cl
from pypool.core.exchange import advance
from pypool.protocol import errors
from pypool.protocol import messages as m
from pypool.protocol.errors import PoolerError
from pypool.protocol.framing import MessageBuffer
from pypool.protocol.startup import CancelRequest, StartupMessage

pytestmark = pytest.mark.timeout(30)

T = TypeVar("T")
USER = "app"
PASSWORD = "app-secret"
VERIFIER = ScramVerifier.from_password(PASSWORD, 4096, b"0123456789abcdef")


class Client:
    """One exchange and what it wrote."""

    def __init__(self, step: Generator[bytes, bytes, T]) -> None:
        self.step = step
        self.sent = bytearray()
        self.sent += next(step)

    def feed(self, data: bytes):  # type: ignore[no-untyped-def]
        return advance(self.step, data, self.sent.extend)

    def replies(self) -> list[tuple[int, bytes]]:
        buffer = MessageBuffer()
        buffer.feed(bytes(self.sent))
        self.sent.clear()
        return list(buffer.messages())


def startup_packet(params: dict[str, str], version: int = 196608) -> bytes:
    body = struct.pack("!I", version) + b"".join(
        k.encode() + b"\x00" + v.encode() + b"\x00" for k, v in params.items()
    ) + b"\x00"
    return struct.pack("!I", len(body) + 4) + body


def password(text: str) -> bytes:
    return m.password_message(m.cstring(text))


def sasl_initial(data: bytes | None, mechanism: str = MECHANISM) -> bytes:
    length = struct.pack("!i", -1 if data is None else len(data))
    return m.password_message(m.cstring(mechanism) + length + (data or b""))


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


class ScramClient:
    """A libpq-style SCRAM client (empty user name in client-first)."""

    def __init__(self, password_text: str) -> None:
        self.password = password_text
        self.bare = "n=,r=clientnonce0123456789"
        self.client_key = b""
        self.server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self.bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        attrs = dict(part.split("=", 1) for part in text.split(","))
        salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(),
                                     base64.b64decode(attrs["s"]), int(attrs["i"]))
        self.client_key = _hmac(salted, b"Client Key")
        stored = hashlib.sha256(self.client_key).digest()
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = f"{self.bare},{text},{without_proof}".encode()
        proof = bytes(a ^ b for a, b in zip(self.client_key, _hmac(stored, auth_message),
                                            strict=True))
        self.server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def exchange(secret: str | None, auth_type: str = "scram-sha-256") -> Client:
    return Client(cl.password_exchange(USER, secret, auth_type, 1 << 20))


def auth_code(kind_body: tuple[int, bytes]) -> tuple[int, bytes]:
    kind, body = kind_body
    assert kind == m.AUTHENTICATION
    return m.parse_authentication(body)


# --- the startup packet ---------------------------------------------------------------------


def test_ssl_request_is_refused_then_the_startup_message_read() -> None:
    client = Client(cl.read_startup())
    ssl = struct.pack("!II", 8, 80877103)
    start = startup_packet({"user": USER, "database": "db"})
    assert client.feed(ssl) is None
    assert bytes(client.sent) == b"N"
    client.sent.clear()
    first = client.feed(start[:7])
    assert first is None
    first = client.feed(start[7:] + b"p\x00")
    assert isinstance(first, cl.FirstPacket)
    assert isinstance(first.packet, StartupMessage)
    assert first.packet.params == {"user": USER, "database": "db"}
    assert first.rest == b"p\x00"
    assert not client.sent


def test_ssl_request_and_startup_in_one_read_is_refused() -> None:
    # Bytes behind an SSLRequest were sent before its answer, so in the clear whatever the
    # answer (CVE-2021-23222): refused, as PgBouncer refuses them, TLS offered or not.
    for tls in (cl.NO_TLS, cl.StartupTls(offered=True)):
        client = Client(cl.read_startup(tls))
        with pytest.raises(PoolerError, match="^received unencrypted data after SSL request$"):
            client.feed(struct.pack("!II", 8, 80877103) + startup_packet({"user": USER}))
        assert not client.sent


def test_cancel_request_ends_the_startup() -> None:
    client = Client(cl.read_startup())
    first = client.feed(struct.pack("!IIII", 16, 80877102, 42, 7))
    assert first == cl.FirstPacket(CancelRequest(42, 7), b"")


def test_a_newer_minor_version_gets_negotiate_protocol_version() -> None:
    client = Client(cl.read_startup())
    first = client.feed(startup_packet({"user": USER, "_pq_.x": "1"}, version=196610))
    assert isinstance(first, cl.FirstPacket)
    [(kind, body)] = client.replies()
    assert kind == m.NEGOTIATE_PROTOCOL_VERSION
    assert struct.unpack_from("!II", body) == (196608, 1)


def test_garbage_before_the_startup_packet() -> None:
    client = Client(cl.read_startup())
    with pytest.raises(errors.ClientProtocolError, match="bad packet header") as info:
        client.feed(b"GET / HTTP/1.1\r\n")
    assert info.value.sqlstate == "08P01"
    client = Client(cl.read_startup())
    with pytest.raises(PoolerError, match="client password pkt before startup packet"):
        client.feed(password("x"))


def test_login_names_and_parameters() -> None:
    assert cl.login_names({"user": USER}) == (USER, USER)
    assert cl.login_names({"user": USER, "database": "db"}) == (USER, "db")
    with pytest.raises(errors.ClientProtocolError, match="no username supplied") as info:
        cl.login_names({"database": "db"})
    assert info.value.sqlstate == "28000"
    params = {"user": USER, "application_name": "a", "datestyle": "ISO", "extra_float_digits": "2"}
    assert cl.tracked_parameters(params, (), ("extra_float_digits",)) == {
        "application_name": "a", "DateStyle": "ISO"}
    with pytest.raises(PoolerError, match="unsupported startup parameter: extra_float_digits"):
        cl.tracked_parameters(params, (), ())


def test_what_is_held_before_the_password_request() -> None:
    cl.check_held(b"")
    cl.check_held(password("x"))
    with pytest.raises(errors.ClientProtocolError, match="client re-sent startup pkt"):
        cl.check_held(startup_packet({"user": "other"}))
    with pytest.raises(errors.ClientProtocolError, match="bytes sent before the authentication"):
        cl.check_held(b"p" + b"\x01" * 70000)


# --- the password ---------------------------------------------------------------------------


@pytest.mark.parametrize("secret", [str(VERIFIER), PASSWORD])
def test_a_full_scram_exchange(secret: str) -> None:
    client = exchange(secret)
    [request] = client.replies()
    code, payload = auth_code(request)
    assert code == m.AUTH_SASL and m.parse_sasl_mechanisms(payload) == [MECHANISM]
    scram = ScramClient(PASSWORD)
    # The SASLInitialResponse in two reads: nothing is answered until it is whole.
    message = sasl_initial(scram.first())
    assert client.feed(message[:3]) is None and not client.sent
    assert client.feed(message[3:]) is None
    code, server_first = auth_code(client.replies()[0])
    assert code == m.AUTH_SASL_CONTINUE
    done = client.feed(password_bytes(scram.final(server_first)) + m.query("SELECT 1"))
    assert isinstance(done, cl.Authenticated)
    code, final = auth_code((done.reply[0], done.reply[5:]))
    assert code == m.AUTH_SASL_FINAL
    assert final == b"v=" + base64.b64encode(scram.server_signature)
    assert done.client_key == scram.client_key
    assert done.rest == m.query("SELECT 1")


def password_bytes(data: bytes) -> bytes:
    """A SASLResponse: the data, not NUL-terminated."""
    return m.password_message(data)


def test_scram_without_an_initial_response_asks_for_it() -> None:
    client = exchange(str(VERIFIER))
    client.replies()
    scram = ScramClient(PASSWORD)
    assert client.feed(sasl_initial(None)) is None
    assert auth_code(client.replies()[0]) == (m.AUTH_SASL_CONTINUE, b"")
    assert client.feed(password_bytes(scram.first())) is None
    code, server_first = auth_code(client.replies()[0])
    assert code == m.AUTH_SASL_CONTINUE
    done = client.feed(password_bytes(scram.final(server_first)))
    assert isinstance(done, cl.Authenticated) and done.client_key == scram.client_key


def scram_failure(secret: str | None, password_text: str) -> PoolerError:
    client = exchange(secret)
    client.replies()
    scram = ScramClient(password_text)
    client.feed(sasl_initial(scram.first()))
    _, server_first = auth_code(client.replies()[0])
    with pytest.raises(PoolerError) as info:
        client.feed(password_bytes(scram.final(server_first)))
    return info.value


def test_a_wrong_scram_password_and_an_unknown_user_fail_alike() -> None:
    wrong = scram_failure(str(VERIFIER), "not-it")
    unknown = scram_failure(None, PASSWORD)
    for failure in (wrong, unknown):
        assert (failure.message, failure.sqlstate, failure.side) == (
            "SASL authentication failed", "28P01", errors.Side.CLIENT)


def test_the_unknown_users_salt_is_stable() -> None:
    def salt() -> bytes:
        client = exchange(None)
        client.replies()
        client.feed(sasl_initial(ScramClient(PASSWORD).first()))
        _, server_first = auth_code(client.replies()[0])
        return dict(p.split("=", 1) for p in server_first.decode().split(","))["s"].encode()

    assert salt() == salt()


def test_a_malformed_sasl_message_is_a_protocol_violation() -> None:
    client = exchange(str(VERIFIER))
    client.replies()
    with pytest.raises(errors.ClientProtocolError, match="malformed SCRAM message") as info:
        client.feed(sasl_initial(b"x,,n=,r=abc"))
    assert info.value.sqlstate == "08P01"
    client = exchange(str(VERIFIER))
    with pytest.raises(errors.ClientProtocolError, match="invalid SASLInitialResponse"):
        client.feed(m.password_message(m.cstring(MECHANISM) + struct.pack("!i", 99) + b"x"))
    client = exchange(str(VERIFIER))
    with pytest.raises(PoolerError, match="SASL authentication failed"):
        client.feed(sasl_initial(b"n,,n=,r=abc", mechanism="SCRAM-SHA-1"))


def test_md5() -> None:
    client = exchange(md5_hash(PASSWORD, USER), "md5")
    code, salt = auth_code(client.replies()[0])
    assert code == m.AUTH_MD5_PASSWORD and len(salt) == 4
    done = client.feed(password(md5_response(md5_hash(PASSWORD, USER), salt)))
    assert done == cl.Authenticated(b"", None, b"")
    client = exchange(PASSWORD, "md5")
    _, salt = auth_code(client.replies()[0])
    with pytest.raises(PoolerError, match="password authentication failed") as info:
        client.feed(password(md5_response(md5_hash("wrong", USER), salt)))
    assert info.value.sqlstate == "28P01"


@pytest.mark.parametrize("secret", [PASSWORD, md5_hash(PASSWORD, USER), str(VERIFIER)])
def test_cleartext(secret: str) -> None:
    client = exchange(secret, "plain")
    assert auth_code(client.replies()[0]) == (m.AUTH_CLEARTEXT_PASSWORD, b"")
    assert client.feed(password(PASSWORD)) == cl.Authenticated(b"", None, b"")
    client = exchange(secret, "plain")
    with pytest.raises(PoolerError, match="password authentication failed"):
        client.feed(password("wrong"))


def test_cleartext_for_an_unknown_user_fails() -> None:
    client = exchange(None, "plain")
    with pytest.raises(PoolerError, match="password authentication failed"):
        client.feed(password(PASSWORD))


@pytest.mark.parametrize(("secret", "auth_type", "method"), [
    (PASSWORD, "md5", cl.MD5),
    (str(VERIFIER), "md5", cl.SCRAM),  # a verifier cannot check an md5 response
    (md5_hash(PASSWORD, USER), "scram-sha-256", cl.MD5),
    (None, "scram-sha-256", cl.SCRAM),
    (None, "md5", cl.MD5),
    (PASSWORD, "plain", cl.CLEARTEXT),
])
def test_auth_method(secret: str | None, auth_type: str, method: str) -> None:
    assert cl.auth_method(secret, auth_type) == method


def test_only_password_messages_before_login() -> None:
    client = exchange(PASSWORD, "plain")
    with pytest.raises(errors.ClientProtocolError, match="expected a password message") as info:
        client.feed(m.query("SELECT 1"))
    assert info.value.sqlstate == "28000"


def test_a_password_message_is_at_most_64_kib() -> None:
    client = exchange(PASSWORD, "plain")
    with pytest.raises(errors.ClientProtocolError, match="password packet too long"):
        client.feed(b"p" + struct.pack("!I", 70000))  # refused from its header alone
    client = exchange(PASSWORD, "plain")
    with pytest.raises(errors.ClientProtocolError, match="invalid message length 2"):
        client.feed(b"p" + struct.pack("!I", 2))


# --- auth_type = peer -------------------------------------------------------------------------


def test_peer_needs_the_same_os_user_and_a_known_user() -> None:
    cl.check_peer("alice", "secret", "alice")  # in
    for secret, os_user in (("secret", "bob"), ("secret", None), (None, "alice")):
        with pytest.raises(PoolerError) as refused:
            cl.check_peer("alice", secret, os_user)
        # PgBouncer's words; a failed login, so the client's side, 28000.
        assert refused.value.message == "unix socket login rejected"
        assert refused.value.sqlstate == errors.INVALID_AUTHORIZATION
        assert refused.value.side is errors.Side.CLIENT


# --- TLS: the SSLRequest's answer, require, channel binding, certificates --------------------

SSL_REQUEST = struct.pack("!II", 8, 80877103)
GSSENC_REQUEST = struct.pack("!II", 8, 80877104)


def test_an_offered_ssl_request_is_answered_s_and_starts_tls() -> None:
    client = Client(cl.read_startup(cl.StartupTls(offered=True)))
    assert client.feed(SSL_REQUEST) == cl.StartTls()
    assert bytes(client.sent) == b"S"


def test_inside_tls_the_startup_message_is_read() -> None:
    client = Client(cl.read_startup(cl.StartupTls(active=True)))
    first = client.feed(startup_packet({"user": USER}))
    assert isinstance(first, cl.FirstPacket) and isinstance(first.packet, StartupMessage)


def test_a_second_ssl_request_inside_tls_is_refused() -> None:
    client = Client(cl.read_startup(cl.StartupTls(active=True)))
    with pytest.raises(PoolerError, match="^SSL req inside SSL$"):
        client.feed(SSL_REQUEST)


def test_required_tls_refuses_a_plaintext_startup_but_not_a_cancel() -> None:
    required = cl.StartupTls(offered=True, required=True)
    client = Client(cl.read_startup(required))
    with pytest.raises(PoolerError, match="^SSL required$") as info:
        client.feed(startup_packet({"user": USER}))
    assert info.value.sqlstate == errors.PROTOCOL_VIOLATION and info.value.fatal
    client = Client(cl.read_startup(required))
    assert client.feed(struct.pack("!IIII", 16, 80877102, 1, 2)) == cl.FirstPacket(
        CancelRequest(1, 2), b"")
    # A GSSENCRequest gets 'N' first, and then TLS is still on offer.
    client = Client(cl.read_startup(required))
    assert client.feed(GSSENC_REQUEST) is None
    assert client.feed(SSL_REQUEST) == cl.StartTls()
    assert bytes(client.sent) == b"NS"


def test_bytes_behind_a_gssenc_request_are_refused() -> None:
    client = Client(cl.read_startup())
    with pytest.raises(PoolerError, match="after GSSAPI encryption request$"):
        client.feed(GSSENC_REQUEST + startup_packet({"user": USER}))


def test_over_tls_scram_sha_256_plus_is_offered_first() -> None:
    client = Client(cl.password_exchange(USER, str(VERIFIER), "scram-sha-256", 1 << 20,
                                         b"\x01" * 32))
    code, payload = auth_code(client.replies()[0])
    assert code == m.AUTH_SASL
    assert m.parse_sasl_mechanisms(payload) == ["SCRAM-SHA-256-PLUS", MECHANISM]


def test_plus_is_refused_without_tls() -> None:
    client = exchange(str(VERIFIER))
    client.replies()
    with pytest.raises(PoolerError, match="SASL authentication failed"):
        client.feed(sasl_initial(b"p=tls-server-end-point,,n=,r=abc",
                                 mechanism="SCRAM-SHA-256-PLUS"))


def test_a_downgrade_is_28000() -> None:
    client = Client(cl.password_exchange(USER, str(VERIFIER), "scram-sha-256", 1 << 20,
                                         b"\x01" * 32))
    client.replies()
    with pytest.raises(PoolerError, match="negotiation error") as info:
        client.feed(sasl_initial(b"y,,n=,r=abc"))
    assert info.value.sqlstate == errors.INVALID_AUTHORIZATION


@pytest.mark.parametrize(("secret", "tls", "names", "problem"), [
    ("x", True, (USER,), None),
    ("x", True, ("someone", USER), None),
    ("x", False, None, "TLS connection required"),
    ("x", True, None, "TLS client certificate required"),
    (None, True, (USER,), "unknown user"),
    ("x", True, ("someone",), "TLS certificate name mismatch"),
])
def test_certificate_login(secret: str | None, tls: bool, names: tuple[str, ...] | None,
                           problem: str | None) -> None:
    assert cl.cert_login_problem(USER, secret, tls, names) == problem


CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


def test_a_client_hello_first_is_direct_tls_when_offered() -> None:
    client = Client(cl.read_startup(cl.StartupTls(offered=True, required=True)))
    assert client.feed(CLIENT_HELLO) == cl.StartTls(CLIENT_HELLO)
    assert not client.sent  # no 'S': there was no SSLRequest to answer


def test_a_client_hello_without_tls_is_a_bad_packet() -> None:
    for tls in (cl.NO_TLS, cl.StartupTls(active=True)):
        client = Client(cl.read_startup(tls))
        with pytest.raises(PoolerError, match="bad packet header"):
            client.feed(CLIENT_HELLO)
