"""SCRAM-SHA-256 both ways, sans-IO: the pooler's server side against scramp's client and a
libpq-style client written here from RFC 5802, and the pooler's client side (password and
recovered ClientKey) against the pooler's own server side.

Logging into the real PostgreSQL with a recovered ClientKey is covered in
tests/integration/test_auth.py (scramp's server rejects libpq's empty `n=`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import pytest
from scramp import ScramClient

from pypool.auth.scram import (
    MECHANISM,
    ScramAuthError,
    ScramClientLogin,
    ScramMalformedError,
    ScramServerExchange,
    ScramVerifier,
    is_scram_verifier,
    verifier_for_password,
)

pytestmark = pytest.mark.timeout(20)

PASSWORD = "app-secret"


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)


def client_key_of(password: str, verifier: ScramVerifier) -> bytes:
    return _hmac(salted_password(password, verifier.salt, verifier.iterations), b"Client Key")


class LibpqStyleClient:
    """What libpq sends: an empty user name in client-first (`n,,n=,r=...`)."""

    def __init__(self, password: str) -> None:
        self.password = password
        self.nonce = base64.b64encode(os.urandom(18)).decode()
        self.bare = f"n=,r={self.nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self.bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        attrs = dict(part.split("=", 1) for part in text.split(","))
        assert attrs["r"].startswith(self.nonce)
        salted = salted_password(self.password, base64.b64decode(attrs["s"]), int(attrs["i"]))
        client_key = _hmac(salted, b"Client Key")
        stored_key = hashlib.sha256(client_key).digest()
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = f"{self.bare},{text},{without_proof}".encode()
        proof = bytes(a ^ b for a, b in zip(client_key, _hmac(stored_key, auth_message),
                                            strict=True))
        self.server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check_final(self, server_final: bytes) -> None:
        assert server_final.decode() == "v=" + base64.b64encode(self.server_signature).decode()


# --- the verifier ---------------------------------------------------------------------------


def test_verifier_from_password_matches_rfc_5802_math() -> None:
    salt = os.urandom(16)
    v = ScramVerifier.from_password(PASSWORD, 4096, salt)
    salted = salted_password(PASSWORD, salt, 4096)
    assert v.iterations == 4096
    assert v.salt == salt
    assert v.stored_key == hashlib.sha256(_hmac(salted, b"Client Key")).digest()
    assert v.server_key == _hmac(salted, b"Server Key")


def test_verifier_from_password_is_postgresqls_with_saslprep() -> None:
    """The same keys scramp's make_auth_info (SASLprep, then PBKDF2) gives, for ASCII and
    for a password SASLprep changes (a no-break space becomes a space)."""
    from scramp import ScramMechanism

    mechanism = ScramMechanism(MECHANISM)
    for password in (PASSWORD, "pässwörd\u00a0x"):
        salt = os.urandom(16)
        _, stored, server, _ = mechanism.make_auth_info(password, 4096, salt)
        v = ScramVerifier.from_password(password, 4096, salt)
        assert (v.stored_key, v.server_key) == (stored, server)
    assert (ScramVerifier.from_password("p\u00a0w", 4096, b"s" * 16)
            == ScramVerifier.from_password("p w", 4096, b"s" * 16))
    # SASLprep refuses a control character: the raw password is used, as in PostgreSQL.
    raw = ScramVerifier.from_password("tab\there", 4096, b"s" * 16)
    salted = salted_password("tab\there", b"s" * 16, 4096)
    assert raw.stored_key == hashlib.sha256(_hmac(salted, b"Client Key")).digest()


def test_a_plaintext_secrets_verifier_is_made_once_per_password_and_count() -> None:
    first = verifier_for_password("cache_user", PASSWORD, 4096)
    assert verifier_for_password("cache_user", PASSWORD, 4096) is first  # cached
    changed = verifier_for_password("cache_user", "new-secret", 4096)
    assert changed.stored_key != first.stored_key  # a new password is a new entry
    assert changed.salt == first.salt  # the user's stable (mock) salt
    fewer = verifier_for_password("cache_user", PASSWORD, 1024)
    assert fewer.iterations == 1024 and fewer.stored_key != first.stored_key


def test_a_stored_verifier_is_parsed_once_per_text() -> None:
    text = str(ScramVerifier.from_password(PASSWORD, 4096, b"0123456789abcdef"))
    assert ScramVerifier.parse(text) is ScramVerifier.parse(text)
    other = str(ScramVerifier.from_password("new-secret", 4096, b"0123456789abcdef"))
    assert ScramVerifier.parse(other) != ScramVerifier.parse(text)


def test_scram_iterations_is_the_count_offered_for_plaintext_and_unknown_users() -> None:
    for verifier in (verifier_for_password("u", PASSWORD, 2048), None):
        server = ScramServerExchange(verifier, "u", mock_iterations=2048)
        first = server.client_first(LibpqStyleClient(PASSWORD).first())
        assert first.decode().endswith(",i=2048")
    client = LibpqStyleClient(PASSWORD)
    server = ScramServerExchange(verifier_for_password("u", PASSWORD, 2048), "u")
    client.check_final(server.client_final(client.final(server.client_first(client.first()))))
    assert server.client_key is not None


def test_verifier_text_round_trip() -> None:
    v = ScramVerifier.from_password(PASSWORD)
    text = str(v)
    assert text.startswith("SCRAM-SHA-256$4096:")
    assert is_scram_verifier(text)
    assert ScramVerifier.parse(text) == v


_GOOD = str(ScramVerifier.from_password(PASSWORD, 4096, b"0123456789abcdef"))
_MECH, _ITER_SALT, _KEYS = _GOOD.split("$")
_STORED, _SERVER = _KEYS.split(":")


def test_good_verifier_parses() -> None:
    # The shapes the broken ones below are made from must parse.
    assert ScramVerifier.parse(_GOOD) is not None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plaintext-password",
        "md5" + "0" * 32,
        f"SCRAM-SHA-1${_ITER_SALT}${_KEYS}",
        f"{_MECH}$notanumber:{_ITER_SALT.split(':')[1]}${_KEYS}",
        f"{_MECH}${_ITER_SALT}${_STORED}",  # no ServerKey
        f"{_MECH}$4096:!!!${_KEYS}",  # salt is not base64
        f"{_MECH}${_ITER_SALT}$!{_STORED[1:]}:{_SERVER}",  # StoredKey is not base64
        f"{_MECH}${_ITER_SALT}$a2V5:{_SERVER}",  # StoredKey of 3 bytes
        f"{_MECH}${_ITER_SALT}${_STORED}:a2V5",  # ServerKey of 3 bytes
        f"{_MECH}$4096:${_KEYS}",  # empty salt
    ],
)
def test_verifier_parse_rejects(text: str) -> None:
    assert ScramVerifier.parse(text) is None


# --- the pooler as a SCRAM server -----------------------------------------------------------


def test_server_exchange_with_scramp_client() -> None:
    verifier = ScramVerifier.from_password(PASSWORD)
    server = ScramServerExchange(verifier)
    client = ScramClient([MECHANISM], "app", PASSWORD)
    server_first = server.client_first(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    server_final = server.client_final(client.get_client_final().encode())
    client.set_server_final(server_final.decode())  # raises if the signature is wrong
    assert server.client_key == client_key_of(PASSWORD, verifier)


def test_server_exchange_with_libpq_style_empty_user() -> None:
    verifier = ScramVerifier.from_password(PASSWORD, 4096)
    server = ScramServerExchange(verifier)
    client = LibpqStyleClient(PASSWORD)
    server_first = server.client_first(client.first())
    assert server_first.decode().startswith(f"r={client.nonce}")
    assert ",i=4096" in server_first.decode()
    server_final = server.client_final(client.final(server_first))
    client.check_final(server_final)
    assert server.client_key == client_key_of(PASSWORD, verifier)


def test_server_nonce_is_fresh_each_time() -> None:
    verifier = ScramVerifier.from_password(PASSWORD)
    firsts = {
        ScramServerExchange(verifier).client_first(b"n,,n=,r=abc").decode() for _ in range(5)
    }
    assert len(firsts) == 5


def test_wrong_password_fails_with_scramp_client() -> None:
    server = ScramServerExchange(ScramVerifier.from_password(PASSWORD))
    client = ScramClient([MECHANISM], "app", "wrong")
    client.set_server_first(server.client_first(client.get_client_first().encode()).decode())
    with pytest.raises(ScramAuthError):
        server.client_final(client.get_client_final().encode())
    assert server.client_key is None


def test_wrong_password_fails_with_libpq_style_client() -> None:
    server = ScramServerExchange(ScramVerifier.from_password(PASSWORD))
    client = LibpqStyleClient("wrong")
    with pytest.raises(ScramAuthError):
        server.client_final(client.final(server.client_first(client.first())))
    assert server.client_key is None


def run_failing_exchange(verifier: ScramVerifier | None, password: str) -> tuple[str, str]:
    """server-first shape (with the nonces masked) and the error of a failing exchange."""
    server = ScramServerExchange(verifier)
    client = LibpqStyleClient(password)
    first = server.client_first(client.first()).decode()
    with pytest.raises(ScramAuthError) as info:
        server.client_final(client.final(first.encode()))
    attrs = dict(part.split("=", 1) for part in first.split(","))
    shape = f"r=<{len(attrs['r'])}>,s=<{len(base64.b64decode(attrs['s']))}>,i={attrs['i']}"
    return shape, type(info.value).__name__


def test_unknown_user_fails_like_a_wrong_password() -> None:
    # A verifier as PostgreSQL makes them (16-byte salt, 4096 iterations).
    known = ScramVerifier.from_password(PASSWORD, 4096, os.urandom(16))
    # The same salt length and iteration count, the same exception type: nothing to probe.
    assert run_failing_exchange(None, PASSWORD) == run_failing_exchange(known, "wrong")


def test_unknown_user_fails_even_with_any_password() -> None:
    for password in ("", PASSWORD, "x" * 100):
        server = ScramServerExchange(None)
        client = ScramClient([MECHANISM], "ghost", password or "x")
        client.set_server_first(server.client_first(client.get_client_first().encode()).decode())
        with pytest.raises(ScramAuthError):
            server.client_final(client.get_client_final().encode())
        assert server.client_key is None


@pytest.mark.parametrize(
    "first",
    [b"\xff\xfe", b"garbage", b"p=tls-server-end-point,,n=,r=abc", b"n,,n=", b"n,,n=,r="],
)
def test_malformed_client_first(first: bytes) -> None:
    server = ScramServerExchange(ScramVerifier.from_password(PASSWORD))
    with pytest.raises(ScramAuthError):
        server.client_first(first)


def test_tampered_client_final() -> None:
    verifier = ScramVerifier.from_password(PASSWORD)
    cases = []
    client = LibpqStyleClient(PASSWORD)
    server = ScramServerExchange(verifier)
    final = client.final(server.client_first(client.first())).decode()
    without, _, proof = final.rpartition(",p=")
    attrs = dict(part.split("=", 1) for part in without.split(","))
    cases.append(f"c=biws,r={attrs['r']}X,p={proof}")  # nonce changed
    cases.append(f"c=eSws,r={attrs['r']},p={proof}")  # channel binding flag changed
    cases.append(f"c=biws,r={attrs['r']},p=!!notbase64")
    cases.append(f"c=biws,r={attrs['r']},p={base64.b64encode(b'short').decode()}")
    cases.append(f"c=biws,r={attrs['r']}")  # no proof at all
    for case in cases:
        fresh = ScramServerExchange(verifier)
        c = LibpqStyleClient(PASSWORD)
        real = c.final(fresh.client_first(c.first())).decode()
        nonce = dict(p.split("=", 1) for p in real.rpartition(",p=")[0].split(","))["r"]
        tampered = case.replace(attrs["r"], nonce)
        with pytest.raises(ScramAuthError):
            fresh.client_final(tampered.encode())
        assert fresh.client_key is None
    # The untampered final still works on its own exchange.
    client.check_final(server.client_final(final.encode()))


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        # PostgreSQL and PgBouncer refuse an authorization identity and a mandatory extension.
        (b"n,a=postgres,n=,r=abc", "authorization identity"),
        (b"y,a=app,n=app,r=abc", "authorization identity"),
        (b"n,,m=ext,n=,r=abc", "unsupported SCRAM extension"),
        (b"n,,n=,r=ab\x01c", "malformed SCRAM message"),  # a nonce must be printable
        (b"n,,r=abc", "malformed SCRAM message"),  # no user name attribute
        (b"n,,n=,x=1,r=abc", "malformed SCRAM message"),  # r must follow n
        (b"n,,n=,r=abc,=x", "malformed SCRAM message"),  # an extension without a name
        (b"n,,n=,r=abc\x00", "malformed SCRAM message"),
        (b"nx,,n=,r=abc", "malformed SCRAM message"),
        (b"p=tls-server-end-point,,n=,r=abc", "channel binding"),
    ],
)
def test_client_first_that_postgres_refuses_is_malformed(first: bytes, reason: str) -> None:
    server = ScramServerExchange(ScramVerifier.from_password(PASSWORD))
    with pytest.raises(ScramMalformedError, match=reason):
        server.client_first(first)


def test_client_first_may_carry_optional_extensions() -> None:
    server = ScramServerExchange(ScramVerifier.from_password(PASSWORD))
    assert server.client_first(b"n,,n=app,r=abc,x=ext").startswith(b"r=abc")


def test_client_final_with_attributes_out_of_order_or_doubled_is_malformed() -> None:
    verifier = ScramVerifier.from_password(PASSWORD)
    for tamper in (
        lambda w, p: f"r={w['r']},c=biws,p={p}",  # order
        lambda w, p: f"c=biws,r={w['r']},r={w['r']},p={p}",  # r twice
        lambda w, p: f"c=biws,r={w['r']},p={p},x=1",  # something after the proof
        lambda w, p: f"c=biws,r={w['r']},p={p},p={p}",
    ):
        server = ScramServerExchange(verifier)
        client = LibpqStyleClient(PASSWORD)
        real = client.final(server.client_first(client.first())).decode()
        without, _, proof = real.rpartition(",p=")
        attrs = dict(part.split("=", 1) for part in without.split(","))
        with pytest.raises(ScramMalformedError):
            server.client_final(tamper(attrs, proof).encode())
        assert server.client_key is None


def test_wrong_proof_is_a_failed_login_not_malformed() -> None:
    server = ScramServerExchange(ScramVerifier.from_password(PASSWORD))
    client = LibpqStyleClient("wrong")
    with pytest.raises(ScramAuthError) as info:
        server.client_final(client.final(server.client_first(client.first())))
    assert not isinstance(info.value, ScramMalformedError)


def test_client_final_before_client_first_is_malformed() -> None:
    server = ScramServerExchange(ScramVerifier.from_password(PASSWORD))
    with pytest.raises(ScramMalformedError):
        server.client_final(b"c=biws,r=,p=AAAA")


# --- the pooler as a SCRAM client -----------------------------------------------------------


def login_against_pooler_server(login: ScramClientLogin, verifier: ScramVerifier) -> None:
    server = ScramServerExchange(verifier)
    server_first = server.client_first(login.client_first())
    server_final = server.client_final(login.server_first(server_first))
    login.server_final(server_final)


def test_client_login_with_password() -> None:
    verifier = ScramVerifier.from_password(PASSWORD)
    login_against_pooler_server(ScramClientLogin("app", password=PASSWORD), verifier)


def test_client_login_with_recovered_client_key() -> None:
    """The passthrough path: a client logs in, its ClientKey is recovered from its proof,
    and the pooler logs in elsewhere with that ClientKey and the verifier's ServerKey."""
    verifier = ScramVerifier.from_password(PASSWORD)
    front = ScramServerExchange(verifier)
    client = ScramClient([MECHANISM], "app", PASSWORD)
    client.set_server_first(front.client_first(client.get_client_first().encode()).decode())
    front.client_final(client.get_client_final().encode())
    assert front.client_key is not None

    login = ScramClientLogin("app", client_key=front.client_key, server_key=verifier.server_key)
    assert login.client_first().startswith(b"n,,n=,r=")
    login_against_pooler_server(login, verifier)


def test_client_login_with_wrong_client_key_is_rejected() -> None:
    verifier = ScramVerifier.from_password(PASSWORD)
    login = ScramClientLogin("app", client_key=os.urandom(32), server_key=verifier.server_key)
    server = ScramServerExchange(verifier)
    final = login.server_first(server.client_first(login.client_first()))
    with pytest.raises(ScramAuthError):
        server.client_final(final)


def test_client_login_detects_a_forged_server_signature() -> None:
    verifier = ScramVerifier.from_password(PASSWORD)
    key = client_key_of(PASSWORD, verifier)
    login = ScramClientLogin("app", client_key=key, server_key=verifier.server_key)
    server = ScramServerExchange(verifier)
    server.client_final(login.server_first(server.client_first(login.client_first())))
    forged = b"v=" + base64.b64encode(os.urandom(32))
    with pytest.raises(ScramAuthError):
        login.server_final(forged)
    with pytest.raises(ScramAuthError):
        login.server_final(b"e=invalid-proof")


def test_client_login_with_password_detects_a_forged_server_signature() -> None:
    verifier = ScramVerifier.from_password(PASSWORD)
    login = ScramClientLogin("app", password=PASSWORD)
    server = ScramServerExchange(verifier)
    server.client_final(login.server_first(server.client_first(login.client_first())))
    with pytest.raises(ScramAuthError):  # scramp's ScramException, as the module's own error
        login.server_final(b"v=" + base64.b64encode(os.urandom(32)))


def test_client_login_rejects_a_nonce_that_does_not_extend_its_own() -> None:
    verifier = ScramVerifier.from_password(PASSWORD)
    login = ScramClientLogin("app", client_key=os.urandom(32), server_key=verifier.server_key)
    login.client_first()
    with pytest.raises(ScramAuthError):
        login.server_first(b"r=someoneelse,s=c2FsdA==,i=4096")


def test_client_login_needs_a_secret() -> None:
    with pytest.raises(ValueError):
        ScramClientLogin("app")
    with pytest.raises(ValueError):
        ScramClientLogin("app", client_key=b"k" * 32)


def salt_offered(exchange: ScramServerExchange) -> str:
    first = exchange.client_first(b"n,,n=,r=abc").decode()
    return dict(part.split("=", 1) for part in first.split(","))["s"]


def test_unknown_user_salt_is_stable_per_user_name() -> None:
    # A known user's verifier has one salt; an unknown user's salt must not change from one
    # attempt to the next either, or two attempts tell them apart (PostgreSQL's mock salt).
    assert salt_offered(ScramServerExchange(None, "ghost")) == salt_offered(
        ScramServerExchange(None, "ghost")
    )
    assert salt_offered(ScramServerExchange(None, "ghost")) != salt_offered(
        ScramServerExchange(None, "other")
    )
    assert len(base64.b64decode(salt_offered(ScramServerExchange(None, "ghost")))) == 16
