"""The pooler's login into PostgreSQL (core/server_login.py), fed what a server answers.

`Login` plays the adapter's part (net/server.py). The SCRAM servers are scramp's (for a
password) and the pooler's own client-facing side (for a recovered ClientKey: scramp's server
rejects the empty user name such a login sends, as PostgreSQL does not).
"""

from __future__ import annotations

import hashlib
import hmac

import pytest
from scramp import ScramMechanism

from pypool.auth.md5 import md5_hash, md5_response
from pypool.auth.scram import MECHANISM, ScramServerExchange, ScramVerifier
from pypool.core import server_login as sl
from pypool.core.exchange import advance
from pypool.protocol import messages as m
from pypool.protocol.framing import MessageBuffer
from pypool.protocol.startup import StartupMessage, parse_startup_packet

pytestmark = pytest.mark.timeout(30)

USER = "app"
PASSWORD = "app-secret"
WELCOME = (m.parameter_status("server_version", "17.0")
           + m.parameter_status("TimeZone", "UTC")
           + m.backend_key_data(4242, 99)
           + m.ready_for_query())


class Login:
    """One login and what it wrote."""

    def __init__(self, **secrets: str | bytes | None) -> None:
        self.step = sl.login(USER, "appdb", {"application_name": "pypool"}, **secrets)  # type: ignore[arg-type]
        self.sent = bytearray(next(self.step))

    def feed(self, data: bytes) -> sl.LoggedIn | None:
        return advance(self.step, data, self.sent.extend)

    def replies(self) -> list[tuple[int, bytes]]:
        buffer = MessageBuffer()
        buffer.feed(bytes(self.sent))
        self.sent.clear()
        return list(buffer.messages())


def auth(code: int, payload: bytes = b"") -> bytes:
    return m.authentication(code, payload)


def test_the_startup_message_goes_first() -> None:
    login = Login(password=PASSWORD)
    packet = parse_startup_packet(bytes(login.sent))
    assert isinstance(packet, StartupMessage)
    assert packet.params == {"user": USER, "database": "appdb", "application_name": "pypool"}


def test_parameters_and_backend_key_are_collected_up_to_ready_for_query() -> None:
    login = Login(password=PASSWORD)
    login.sent.clear()
    data = auth(m.AUTH_OK) + m.notice_response("hello") + WELCOME
    # Byte by byte: nothing is decided before a message is whole.
    for i in range(len(data) - 1):
        assert login.feed(data[i : i + 1]) is None
    done = login.feed(data[-1:])
    assert done == sl.LoggedIn({"server_version": "17.0", "TimeZone": "UTC"}, 4242, 99, b"")
    assert not login.sent
    login = Login(password=PASSWORD)
    done = login.feed(data + m.parameter_status("later", "1"))
    assert done is not None and done.rest == m.parameter_status("later", "1")


def test_cleartext() -> None:
    login = Login(password=PASSWORD)
    login.sent.clear()
    assert login.feed(auth(m.AUTH_CLEARTEXT_PASSWORD)) is None
    assert login.replies() == [(m.PASSWORD_MESSAGE, m.cstring(PASSWORD))]
    assert login.feed(auth(m.AUTH_OK) + WELCOME) is not None


@pytest.mark.parametrize("secrets", [{"password": PASSWORD},
                                     {"md5_hash": md5_hash(PASSWORD, USER)}])
def test_md5(secrets: dict[str, str]) -> None:
    login = Login(**secrets)
    login.sent.clear()
    salt = b"\x01\x02\x03\x04"
    login.feed(auth(m.AUTH_MD5_PASSWORD, salt))
    expected = md5_response(md5_hash(PASSWORD, USER), salt)
    assert login.replies() == [(m.PASSWORD_MESSAGE, m.cstring(expected))]


def test_scram_with_a_password_against_scramp() -> None:
    mechanism = ScramMechanism(MECHANISM)
    salt, stored_key, server_key, iterations = mechanism.make_auth_info(PASSWORD)
    server = mechanism.make_server(lambda user: (salt, stored_key, server_key, iterations))
    login = Login(password=PASSWORD)
    login.sent.clear()
    assert login.feed(auth(m.AUTH_SASL, m.cstring(MECHANISM) + b"\x00")) is None
    [(kind, body)] = login.replies()
    assert kind == m.PASSWORD_MESSAGE
    mech, client_first = m.parse_sasl_initial_response(body)
    assert mech == MECHANISM and client_first is not None
    server.set_client_first(client_first.decode())
    login.feed(auth(m.AUTH_SASL_CONTINUE, server.get_server_first().encode()))
    [(kind, client_final)] = login.replies()
    server.set_client_final(client_final.decode())  # raises if the proof is wrong
    final = auth(m.AUTH_SASL_FINAL, server.get_server_final().encode())
    done = login.feed(final + auth(m.AUTH_OK) + WELCOME)
    assert done is not None and done.backend_pid == 4242


def _client_key(password: str, verifier: ScramVerifier) -> bytes:
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), verifier.salt,
                                 verifier.iterations)
    return hmac.new(salted, b"Client Key", hashlib.sha256).digest()


def test_scram_with_a_client_key() -> None:
    verifier = ScramVerifier.from_password(PASSWORD)
    server = ScramServerExchange(verifier, USER)
    login = Login(client_key=_client_key(PASSWORD, verifier), server_key=verifier.server_key)
    login.sent.clear()
    login.feed(auth(m.AUTH_SASL, m.cstring(MECHANISM) + b"\x00"))
    _, client_first = m.parse_sasl_initial_response(login.replies()[0][1])
    assert client_first is not None
    login.feed(auth(m.AUTH_SASL_CONTINUE, server.client_first(client_first)))
    final = server.client_final(login.replies()[0][1])
    assert login.feed(auth(m.AUTH_SASL_FINAL, final) + auth(m.AUTH_OK) + WELCOME) is not None
    # A server that cannot prove it knows the verifier is refused.
    login = Login(client_key=_client_key(PASSWORD, verifier), server_key=verifier.server_key)
    login.sent.clear()
    login.feed(auth(m.AUTH_SASL, m.cstring(MECHANISM) + b"\x00"))
    _, client_first = m.parse_sasl_initial_response(login.replies()[0][1])
    assert client_first is not None
    server = ScramServerExchange(verifier, USER)
    login.feed(auth(m.AUTH_SASL_CONTINUE, server.client_first(client_first)))
    with pytest.raises(sl.ServerLoginError, match="server signature does not verify") as info:
        login.feed(auth(m.AUTH_SASL_FINAL, b"v=AAAA"))
    fields = m.parse_error_fields(info.value.error[5:])
    assert (fields["S"], fields["C"]) == ("FATAL", "08P01")


def test_the_servers_error_response_is_kept_as_sent() -> None:
    login = Login(password=PASSWORD)
    error = m.error_response('password authentication failed for user "app"', "28P01", "FATAL")
    with pytest.raises(sl.ServerLoginError) as info:
        login.feed(auth(m.AUTH_CLEARTEXT_PASSWORD) + error)
    assert str(info.value) == 'password authentication failed for user "app"'
    assert info.value.error == error


@pytest.mark.parametrize(("secrets", "request_", "method"), [
    ({}, auth(m.AUTH_CLEARTEXT_PASSWORD), "cleartext"),
    ({"md5_hash": md5_hash(PASSWORD, USER)}, auth(m.AUTH_CLEARTEXT_PASSWORD), "cleartext"),
    ({}, auth(m.AUTH_MD5_PASSWORD, b"salt"), "md5"),
    ({}, auth(m.AUTH_SASL, m.cstring(MECHANISM) + b"\x00"), "SCRAM"),
    ({"password": PASSWORD}, auth(m.AUTH_SASL, m.cstring("SCRAM-SHA-256-PLUS") + b"\x00"),
     "SASL without SCRAM-SHA-256"),
    ({"password": PASSWORD}, auth(7), "authentication method 7"),
])
def test_no_usable_password(secrets: dict[str, str], request_: bytes, method: str) -> None:
    login = Login(**secrets)
    with pytest.raises(sl.ServerLoginError) as info:
        login.feed(request_)
    text = (f"wrong password type: cannot do {method} authentication to the server for user "
            '"app": no usable password')
    assert str(info.value) == text
    assert info.value.error == m.error_response(text, "08P01", "FATAL")


@pytest.mark.parametrize(("data", "text"), [
    (m.query("SELECT 1"), "unexpected message 'Q' during login"),
    (auth(m.AUTH_SASL_CONTINUE, b"r=x"), "SASLContinue without SASL"),
    (auth(m.AUTH_SASL_FINAL, b"v=x"), "SASLFinal without SASL"),
])
def test_what_cannot_be_followed(data: bytes, text: str) -> None:
    login = Login(password=PASSWORD)
    with pytest.raises(sl.ServerLoginError, match=f"server login failed: {text}"):
        login.feed(data)



def _server_first_for(login: Login, iterations: str, nonce_tail: str = "srv") -> bytes:
    login.sent.clear()
    login.feed(auth(m.AUTH_SASL, m.cstring(MECHANISM) + b"\x00"))
    [(_, body)] = login.replies()
    _, client_first = m.parse_sasl_initial_response(body)
    assert client_first is not None
    nonce = client_first.decode().split("r=", 1)[1]
    return f"r={nonce}{nonce_tail},s=AAECAwQFBgcICQoLDA0ODw==,i={iterations}".encode()


@pytest.mark.parametrize(("secrets", "iterations", "tail", "text"), [
    # CVE class of PgBouncer 1.25.2: a server asking for unbounded PBKDF2 work or sending a
    # nonce without end. Refused before any hashing, with a password or a ClientKey.
    ({"password": PASSWORD}, "2147483647", "srv", "iteration count '2147483647' outside"),
    ({"password": PASSWORD}, "99999999999999999999999", "srv", "iteration count"),
    ({"password": PASSWORD}, "0", "srv", "iteration count '0' outside"),
    ({"password": PASSWORD}, "-1", "srv", "iteration count"),
    ({"password": PASSWORD}, "4096", "x" * 2000, "nonce longer than 1024"),
    ({"password": PASSWORD}, "4096", "x" * 5000, "server-first-message of"),
    ({"client_key": b"k" * 32, "server_key": b"s" * 32}, "2000000", "srv",
     "iteration count '2000000' outside"),
])
def test_a_server_asking_too_much_of_scram_is_refused(
        secrets: dict, iterations: str, tail: str, text: str) -> None:
    login = Login(**secrets)
    first = _server_first_for(login, iterations, tail)
    with pytest.raises(sl.ServerLoginError, match=f"server login failed: .*{text}"):
        login.feed(auth(m.AUTH_SASL_CONTINUE, first))


def test_the_largest_iteration_count_allowed_still_logs_in_as_far_as_the_proof() -> None:
    login = Login(client_key=b"k" * 32, server_key=b"s" * 32)
    login.feed(auth(m.AUTH_SASL_CONTINUE, _server_first_for(login, "1000000")))
    [(kind, body)] = login.replies()
    assert kind == m.PASSWORD_MESSAGE and b",p=" in body


# --- TLS: the SSLRequest's answer, SCRAM-SHA-256-PLUS ----------------------------------------


@pytest.mark.parametrize(("answer", "mode", "start"), [
    (b"S", "prefer", True), (b"S", "verify-full", True),
    (b"N", "allow", False), (b"N", "prefer", False),
])
def test_the_ssl_answer(answer: bytes, mode: str, start: bool) -> None:
    assert sl.tls_answer(answer, mode) is start


@pytest.mark.parametrize(("answer", "mode", "text"), [
    (b"N", "require", "server refused SSL"),
    (b"N", "verify-ca", "server refused SSL"),
    (b"E", "prefer", "bad sslreq answer"),
    (b"S" + m.ready_for_query(), "prefer", "received unencrypted data after SSL response"),
    (b"N" + m.ready_for_query(), "prefer", "received unencrypted data after SSL response"),
])
def test_what_the_ssl_answer_refuses(answer: bytes, mode: str, text: str) -> None:
    with pytest.raises(sl.ServerLoginError, match=f"^{text}$") as info:
        sl.tls_answer(answer, mode)
    assert info.value.error == m.error_response(text, "08006", "FATAL")


def test_the_ssl_request_is_postgresqls() -> None:
    assert sl.SSL_REQUEST == b"\x00\x00\x00\x08\x04\xd2\x16\x2f"


OFFER_BOTH = auth(m.AUTH_SASL, m.cstring("SCRAM-SHA-256-PLUS") + m.cstring(MECHANISM) + b"\x00")


@pytest.mark.parametrize(("binding", "offer", "mechanism"), [
    (b"\x01" * 32, OFFER_BOTH, "SCRAM-SHA-256-PLUS"),
    (None, OFFER_BOTH, MECHANISM),  # no binding to give (a certificate without one)
    (b"\x01" * 32, auth(m.AUTH_SASL, m.cstring(MECHANISM) + b"\x00"), MECHANISM),
])
def test_plus_when_offered_and_bound(binding: bytes | None, offer: bytes,
                                     mechanism: str) -> None:
    login = Login(password=PASSWORD, channel_binding=binding)
    login.replies()
    login.feed(offer)
    [(kind, body)] = login.replies()
    chosen, first = m.parse_sasl_initial_response(body)
    assert chosen == mechanism
    assert first is not None
    assert first.startswith(b"p=tls-server-end-point,," if mechanism != MECHANISM else b"n,,")


def test_an_error_before_tls_is_the_servers_own() -> None:
    error = m.error_response("sorry, too many clients already", "53300", "FATAL")
    with pytest.raises(sl.ServerLoginError, match="^sorry, too many clients already$") as info:
        sl.tls_answer(error, "require")
    assert info.value.error == error
