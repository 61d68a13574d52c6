"""SCRAM-SHA-256, both directions.

Towards clients the pooler is a SCRAM server (`ScramServerExchange`, written here, see
there why): it verifies a client's proof against a SCRAM verifier (from the auth_file,
auth_query, or made from a plaintext password). An unknown user gets a full exchange
against a made-up verifier, so it fails exactly like a wrong password and user names
cannot be probed.

Towards servers the pooler is a SCRAM client. With a plaintext password scramp does it all
(imported only then: it brings some 60 modules and 5 MiB with it). With only a verifier
(the setup PgBouncer recommends: userlist.txt holds what pg_authid holds, no plaintext
anywhere) the pooler recovers the ClientKey from the client's own proof,

    ClientKey = ClientProof XOR HMAC(StoredKey, AuthMessage)

and later proves itself to PostgreSQL with that ClientKey (`ScramClientKeyLogin`). scramp has
no hook for logging in without a password, so those few lines of HMAC arithmetic are here.

What a repeated login may reuse is computed once: a stored verifier's parts (`parse`, by its
text, so a changed auth_file line is a new entry) and a plaintext password's verifier
(`verifier_for_password`, by user, password and `scram_iterations`: PBKDF2 costs
milliseconds). Neither holds anything a new password would not replace.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .channel_binding import CHANNEL_BINDING_TYPE

if TYPE_CHECKING:
    from scramp import ScramClient

MECHANISM = "SCRAM-SHA-256"
# With channel binding (auth/channel_binding.py), offered over TLS only.
MECHANISM_PLUS = "SCRAM-SHA-256-PLUS"
# PostgreSQL's and PgBouncer's default (`scram_iterations`, both).
DEFAULT_ITERATIONS = 4096
# What a server may ask of the pooler logging into it: each iteration is PBKDF2 work done
# on the event loop, so a count without bound would stall every client (PgBouncer 1.25.2
# caps it at the same figure); a nonce or message past these sizes is no PostgreSQL's.
MAX_SERVER_ITERATIONS = 1_000_000
MAX_SERVER_NONCE = 1024
MAX_SERVER_MESSAGE = 4096


@dataclass(frozen=True)
class ScramVerifier:
    """The parts of `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    @classmethod
    def parse(cls, text: str) -> ScramVerifier | None:
        """The verifier `text` spells, None if it is none; parsed once per distinct text."""
        return _parse_verifier(text)

    @classmethod
    def _parse(cls, text: str) -> ScramVerifier | None:
        try:
            mech, rest = text.split("$", 1)
            iter_salt, keys = rest.split("$", 1)
            iterations, salt = iter_salt.split(":", 1)
            stored, server = keys.split(":", 1)
            if mech != MECHANISM:
                return None
            b64 = base64.b64decode
            verifier = cls(
                int(iterations),
                b64(salt, validate=True),
                b64(stored, validate=True),
                b64(server, validate=True),
            )
            # SHA-256 keys are 32 bytes; anything else is a damaged verifier.
            if len(verifier.stored_key) != 32 or len(verifier.server_key) != 32:
                return None
            if not verifier.salt or verifier.iterations < 1:
                return None
            return verifier
        except (ValueError, TypeError):
            return None

    @classmethod
    def from_password(
        cls, password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
    ) -> ScramVerifier:
        """RFC 5802's keys, as PostgreSQL derives them (scram_build_secret)."""
        salt = os.urandom(16) if salt is None else salt
        salted = hashlib.pbkdf2_hmac("sha256", _prepared(password), salt, iterations)
        client_key = _hmac(salted, b"Client Key")
        return cls(iterations, salt, hashlib.sha256(client_key).digest(),
                   _hmac(salted, b"Server Key"))

    def __str__(self) -> str:
        b64 = base64.b64encode
        return (
            f"{MECHANISM}${self.iterations}:{b64(self.salt).decode()}$"
            f"{b64(self.stored_key).decode()}:{b64(self.server_key).decode()}"
        )


@functools.lru_cache(maxsize=4096)
def _parse_verifier(text: str) -> ScramVerifier | None:
    return ScramVerifier._parse(text)


def _prepared(password: str) -> bytes:
    """The password as PBKDF2 takes it: SASLprep'd, or as it is where SASLprep fails (as
    PostgreSQL and libpq do). An ASCII password without control characters is its own
    SASLprep, which spares importing scramp's stringprep tables."""
    if password.isascii() and password.isprintable():
        return password.encode()
    from scramp.core import ScramException, saslprep

    try:
        return str(saslprep(password)).encode()
    except ScramException:
        return password.encode()


def is_scram_verifier(secret: str) -> bool:
    return secret.startswith(MECHANISM + "$")


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.digest(key, msg, "sha256")  # OpenSSL's one-shot: no HMAC object


_MOCK_KEY = os.urandom(32)


def mock_salt(user: str) -> bytes:
    """A salt for `user` that stays the same for the life of the process, unguessable."""
    return _hmac(_MOCK_KEY, b"salt:" + user.encode())[:16]


@functools.lru_cache(maxsize=4096)
def verifier_for_password(user: str, password: str,
                          iterations: int = DEFAULT_ITERATIONS) -> ScramVerifier:
    """The verifier a plaintext auth_file entry stands for, computed once per (user,
    password, scram_iterations): a changed password or setting is a new entry.

    PBKDF2 costs milliseconds; caching it keeps connect-heavy loads cheap and makes a known
    user with a plaintext secret answer as fast as an unknown user's mock exchange. The
    salt is the user's mock salt, so the two look alike to a prober too.
    """
    return ScramVerifier.from_password(password, iterations, mock_salt(user))


def _xor(a: bytes, b: bytes) -> bytes:
    if len(a) != len(b):
        raise ValueError("keys of different lengths")
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).to_bytes(len(a), "big")


class ScramAuthError(Exception):
    """The client's SCRAM exchange failed (wrong password, unknown user, malformed)."""


class ScramMalformedError(ScramAuthError):
    """A SCRAM message that breaks RFC 5802's grammar, or asks for what PostgreSQL refuses
    (an authorization identity, a mandatory extension, channel binding): a protocol
    violation (08P01), not a wrong password (28P01). The texts are PostgreSQL's."""


class ScramDowngradeError(ScramMalformedError):
    """The client can bind but was offered no binding (28000, as PostgreSQL)."""


def _attribute_list(text: str) -> list[tuple[str, str]]:
    """`a=value,b=value,...` as (name, value) pairs, in order and with repeats kept.

    RFC 5802: a name is one ASCII letter; a value may be empty (libpq's `n=`) and holds no
    comma (the split sees to that).
    """
    pairs = []
    for part in text.split(","):
        name = part[:1]
        if part[1:2] != "=" or not (name.isascii() and name.isalpha()):
            raise ScramMalformedError(
                f"malformed SCRAM message (attribute expected, but found {part[:8]!r})"
            )
        pairs.append((name, part[2:]))
    return pairs


_PRINTABLE = re.compile(r"[!-+\--~]*")


def _printable(value: str) -> bool:
    """RFC 5802's `printable`: %x21-2B / %x2D-7E, what a nonce is made of."""
    return _PRINTABLE.fullmatch(value) is not None


def _decode(data: bytes, what: str) -> str:
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise ScramMalformedError(f"malformed SCRAM message ({what} is not UTF-8)") from None
    if "\x00" in text:
        raise ScramMalformedError(f"malformed SCRAM message (NUL in {what})")
    return text


class ScramServerExchange:
    """The pooler's side of a client's SCRAM login, one message in and one out per step.

    Written here rather than with scramp's ScramServer: libpq sends an empty user name
    (`n=,r=...`, PostgreSQL takes the name from the startup packet), which scramp's parser
    rejects. `verifier` None means the user is unknown: the exchange runs against a
    made-up verifier and fails at the proof, like a wrong password.

    The messages are read as strictly as PostgreSQL's `read_client_first_message` and
    `read_client_final_message` read them; what breaks the grammar raises
    ScramMalformedError, a proof that does not verify raises ScramAuthError.
    """

    def __init__(self, verifier: ScramVerifier | None, user: str = "",
                 channel_binding: bytes | None = None,
                 mock_iterations: int = DEFAULT_ITERATIONS) -> None:
        self.known = verifier is not None
        # The tls-server-end-point data of the certificate the pooler presented: SCRAM-SHA-
        # 256-PLUS is on offer. `plus`: the client chose it (set before client_first).
        self.channel_binding = channel_binding
        self.plus = False
        # Like PostgreSQL's mock: a salt that is stable per user name (a changing salt
        # would tell an unknown user from a known one) and no PBKDF2 work to time. Its
        # iteration count is the one a plaintext secret's verifier has (scram_iterations).
        self.verifier = verifier or ScramVerifier(
            mock_iterations, mock_salt(user), os.urandom(32), os.urandom(32)
        )
        self.client_key: bytes | None = None
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    @property
    def expects_client_first(self) -> bool:
        """True until client_first() has been given a client-first-message."""
        return not self._nonce

    def client_first(self, data: bytes) -> bytes:
        """Takes client-first-message, returns server-first-message.

        client-first-message = gs2-cbind-flag "," [authzid] "," [reserved-mext ","]
                               username "," nonce ["," extensions]
        """
        if self._nonce:
            raise ScramMalformedError("malformed SCRAM message (a second client-first-message)")
        text = _decode(data, "client-first-message")
        cbind_flag = text[:1]
        if cbind_flag == "p" and self.channel_binding is None:
            # PostgreSQL offers SCRAM-SHA-256-PLUS only over TLS, and so does the pooler.
            raise ScramMalformedError(
                "client requires SCRAM channel binding, but it is not supported"
            )
        if cbind_flag not in ("n", "y", "p"):
            raise ScramMalformedError(
                f"malformed SCRAM message (unexpected channel-binding flag {cbind_flag!r})"
            )
        self._check_binding_choice(cbind_flag)
        if cbind_flag == "p":
            # "p=tls-server-end-point," then the authzid part: made to look like the
            # one-letter flags for what follows.
            cb_end = text.find(",")
            if text[1:2] != "=" or cb_end < 0:
                raise ScramMalformedError("malformed SCRAM message (comma expected)")
            cb_type = text[2:cb_end]
            if cb_type != CHANNEL_BINDING_TYPE:
                raise ScramMalformedError(
                    f'unsupported SCRAM channel-binding type "{cb_type}"')
            text = "p" + text[cb_end:]
        if text[1:2] != ",":
            raise ScramMalformedError("malformed SCRAM message (comma expected)")
        if text[2:3] == "a":
            raise ScramMalformedError(
                "client uses authorization identity, but it is not supported"
            )
        if text[2:3] != ",":
            raise ScramMalformedError(
                "malformed SCRAM message (unexpected attribute in client-first-message)"
            )
        bare = text[3:]
        if bare[:1] == "m":
            raise ScramMalformedError("client requires an unsupported SCRAM extension")
        attrs = _attribute_list(bare)
        # The user name is read and ignored: the startup packet's is the one that counts.
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
            raise ScramMalformedError(
                "malformed SCRAM message (user name and nonce expected in client-first-message)"
            )
        client_nonce = attrs[1][1]
        if not client_nonce or not _printable(client_nonce):
            raise ScramMalformedError("malformed SCRAM message (non-printable nonce)")
        # Any extensions after the nonce are optional ones; none is supported, all ignored.
        self._gs2_header = f"p={CHANNEL_BINDING_TYPE},," if cbind_flag == "p" else text[:3]
        self._client_first_bare = bare
        self._nonce = client_nonce + base64.b64encode(os.urandom(18)).decode()
        v = self.verifier
        self._server_first = (
            f"r={self._nonce},s={base64.b64encode(v.salt).decode()},i={v.iterations}"
        )
        return self._server_first.encode()

    def client_final(self, data: bytes) -> bytes:
        """Takes client-final-message, returns server-final-message or raises ScramAuthError.

        client-final-message = channel-binding "," nonce ["," extensions] "," proof
        """
        if not self._nonce:
            raise ScramMalformedError("malformed SCRAM message (client-final before client-first)")
        text = _decode(data, "client-final-message")
        attrs = _attribute_list(text)
        if len(attrs) < 3 or attrs[0][0] != "c" or attrs[1][0] != "r" or attrs[-1][0] != "p":
            raise ScramMalformedError(
                "malformed SCRAM message (channel binding, nonce and proof expected)"
            )
        if any(name in "crp" for name, _ in attrs[2:-1]):
            raise ScramMalformedError("malformed SCRAM message (attribute repeated)")
        try:
            binding = base64.b64decode(attrs[0][1], validate=True)
            proof = base64.b64decode(attrs[-1][1], validate=True)
        except ValueError:
            raise ScramMalformedError("malformed SCRAM message (invalid base64)") from None
        if self.plus:
            assert self.channel_binding is not None
            if binding != self._gs2_header.encode() + self.channel_binding:
                raise ScramMalformedError("SCRAM channel binding check failed")
        elif binding != self._gs2_header.encode():
            raise ScramMalformedError(
                "malformed SCRAM message (channel binding does not match client-first-message)"
            )
        if attrs[1][1] != self._nonce:
            raise ScramMalformedError("malformed SCRAM message (nonce does not match)")
        v = self.verifier
        if len(proof) != len(v.stored_key):
            raise ScramMalformedError("malformed SCRAM message (invalid proof length)")
        without_proof = text[: text.rindex(",p=")]
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_key = _xor(proof, _hmac(v.stored_key, auth_message))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), v.stored_key):
            raise ScramAuthError("invalid proof")
        if not self.known:
            raise ScramAuthError("unknown user")
        self.client_key = client_key
        signature = base64.b64encode(_hmac(v.server_key, auth_message)).decode()
        return f"v={signature}".encode()


    def _check_binding_choice(self, flag: str) -> None:
        """The client's gs2 flag against the mechanism it chose, as PostgreSQL checks it."""
        if self.plus and flag != "p":
            raise ScramMalformedError(
                "malformed SCRAM message (The client selected SCRAM-SHA-256-PLUS, but the "
                "SCRAM message does not include channel binding data.)")
        if not self.plus and flag == "p":
            raise ScramMalformedError(
                "malformed SCRAM message (The client selected SCRAM-SHA-256 without channel "
                "binding, but the SCRAM message includes channel binding data.)")
        if flag == "y" and self.channel_binding is not None:
            # A client that can bind, told the pooler cannot: someone stripped -PLUS from
            # the offer (a downgrade). PostgreSQL's text; 28000.
            raise ScramDowngradeError(
                "SCRAM channel binding negotiation error (The client supports SCRAM channel "
                "binding but thinks the server does not.  However, this server does support "
                "channel binding.)")


def _attributes(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


class ScramClientLogin:
    """The pooler logging into PostgreSQL with SCRAM, with a password or a ClientKey."""

    def __init__(
        self,
        user: str,
        password: str | None = None,
        client_key: bytes | None = None,
        server_key: bytes | None = None,
        channel_binding: bytes | None = None,
    ) -> None:
        """`channel_binding`: the tls-server-end-point data of the server's certificate, to
        log in with SCRAM-SHA-256-PLUS (the server offered it over TLS); None: without."""
        if password is None and (client_key is None or server_key is None):
            raise ValueError("a password, or a ClientKey and ServerKey, is needed")
        self._password = password
        self._client_key = client_key
        self._server_key = server_key
        self.mechanism = MECHANISM if channel_binding is None else MECHANISM_PLUS
        self._scramp: ScramClient | None = None
        if password is not None:
            from scramp import ScramClient

            binding = (None if channel_binding is None
                       else (CHANNEL_BINDING_TYPE, channel_binding))
            self._scramp = ScramClient([self.mechanism], user, password,
                                       channel_binding=binding)
        # gs2 header, and the `c=` attribute of client-final-message (RFC 5802 7).
        self._gs2_header = "n,," if channel_binding is None else f"p={CHANNEL_BINDING_TYPE},,"
        cbind_input = self._gs2_header.encode() + (channel_binding or b"")
        self._cbind = base64.b64encode(cbind_input).decode()
        self._nonce = base64.b64encode(os.urandom(18)).decode()
        self._client_first_bare = f"n=,r={self._nonce}"
        self._expected_server_signature = b""

    def client_first(self) -> bytes:
        if self._scramp is not None:
            return str(self._scramp.get_client_first()).encode()
        return (self._gs2_header + self._client_first_bare).encode()

    def server_first(self, data: bytes) -> bytes:
        """Takes server-first-message, returns client-final-message.

        Whatever is wrong with the server's message raises ScramAuthError, scramp's errors
        and a missing attribute included, so that the caller needs to catch one type.
        """
        try:
            return self._server_first(data)
        except self._errors() as bad:
            raise ScramAuthError(f"malformed SCRAM server-first-message: {bad}") from None

    def server_final(self, data: bytes) -> None:
        """Checks server-final-message; ScramAuthError if it does not prove the server."""
        try:
            self._server_final(data)
        except self._errors() as bad:
            raise ScramAuthError(f"SCRAM server-final-message does not verify: {bad}") from None

    def _errors(self) -> tuple[type[Exception], ...]:
        """What a malformed server message raises here (scramp's own only with scramp)."""
        if self._scramp is None:
            return (ValueError, KeyError)
        from scramp import ScramException

        return (ScramException, ValueError, KeyError)

    def _server_first(self, data: bytes) -> bytes:
        if len(data) > MAX_SERVER_MESSAGE:
            raise ValueError(f"server-first-message of {len(data)} bytes")
        text = data.decode()
        checked = _attributes(text)
        iterations = checked.get("i", "")
        if not iterations.isdigit() or not 0 < int(iterations) <= MAX_SERVER_ITERATIONS:
            raise ValueError(f"iteration count {iterations[:20]!r} outside 1 to "
                             f"{MAX_SERVER_ITERATIONS}")
        if len(checked.get("r", "")) > MAX_SERVER_NONCE:
            raise ValueError(f"nonce longer than {MAX_SERVER_NONCE} characters")
        if self._scramp is not None:
            self._scramp.set_server_first(text)
            return str(self._scramp.get_client_final()).encode()
        assert self._client_key is not None and self._server_key is not None
        attrs = _attributes(text)
        nonce = attrs["r"]
        if not nonce.startswith(self._nonce):
            raise ScramAuthError("server nonce does not extend the client nonce")
        without_proof = f"c={self._cbind},r={nonce}"
        auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        stored_key = hashlib.sha256(self._client_key).digest()
        proof = _xor(self._client_key, _hmac(stored_key, auth_message))
        self._expected_server_signature = _hmac(self._server_key, auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def _server_final(self, data: bytes) -> None:
        text = data.decode()
        if self._scramp is not None:
            self._scramp.set_server_final(text)
            return
        attrs = _attributes(text)
        if "v" not in attrs:
            raise ScramAuthError(f"server rejected the proof: {text}")
        if base64.b64decode(attrs["v"]) != self._expected_server_signature:
            raise ScramAuthError("server signature does not verify")
