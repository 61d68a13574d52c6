"""TLS with the standard library's ssl: the contexts built from the settings, the handshakes.

What it owns: the two `ssl.SSLContext`s PgBouncer's `client_tls_*` and `server_tls_*` keys
describe (`ClientTls`, the pooler accepting TLS from clients; `ServerTls`, the pooler
connecting to PostgreSQL with TLS), built once at start and again at each reload (`Tls`):
a reload whose files or values do not make a working context is logged and the contexts in
force are kept, so rotating certificates never drops anyone and a bad file breaks nothing.
It also counts the handshakes (net/tls_handshake.py runs them) for the metrics, and formats
what SHOW CLIENTS / SERVERS print in their `tls` column.

When TLS starts is not decided here: the startup packets are core/client_login.py's
(SSLRequest answered 'S' or 'N', "SSL required") and core/server_login.py's (the
SSLRequest to PostgreSQL and its answer). The modes, as PgBouncer reads them:

- clients (`client_tls_sslmode`): disable answers 'N'; allow, prefer offer TLS; require
  refuses a plaintext login over TCP; verify-ca and verify-full also ask for a client
  certificate signed by `client_tls_ca_file` (auth_type = cert needs verify-full). Below
  verify-ca a client certificate is checked when one is sent and a CA file is set. The unix
  socket never does TLS, as PgBouncer.
- servers (`server_tls_sslmode`): disable sends no SSLRequest; allow, prefer take TLS when
  the server offers it, unverified; require refuses a server without TLS; verify-ca checks
  the certificate against `server_tls_ca_file`, verify-full the host name too.

Never here: the startup packets' bytes, the pooler's objects.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Final

from ..auth.channel_binding import tls_server_end_point
from ..core.client_login import StartupTls
from ..settings import TLS_VERSIONS, PoolerSettings, SettingsError
from . import tls13_suites
from .tls_group import negotiated_group

log = logging.getLogger("pypool.tls")

ALPN_POSTGRESQL: Final = "postgresql"
_VERIFYING: Final = ("verify-ca", "verify-full")
_REQUIRING: Final = ("require", "verify-ca", "verify-full")

# libtls's cipher keywords (PgBouncer's `*_tls_ciphers`) as OpenSSL cipher lists (TLS 1.2
# and older; TLS 1.3 suites are not chosen by this list).
_CIPHER_WORDS: Final = {
    "default": "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20",
    "secure": "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20",
    "fast": "ECDHE+AESGCM:ECDHE+CHACHA20",
    "normal": "HIGH:!aNULL",
    "compat": "HIGH:!aNULL",
    "legacy": "HIGH:MEDIUM:!aNULL",
    "insecure": "ALL:!aNULL:!eNULL",
    "all": "ALL:!aNULL:!eNULL",
}
# The TLS 1.3 suites OpenSSL enables, which Python's ssl cannot narrow.
_TLS13_SUITES: Final = frozenset(
    {"TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_GCM_SHA256"}
)
_VERSIONS: Final = {
    "tlsv1.0": ssl.TLSVersion.TLSv1,
    "tlsv1.1": ssl.TLSVersion.TLSv1_1,
    "tlsv1.2": ssl.TLSVersion.TLSv1_2,
    "tlsv1.3": ssl.TLSVersion.TLSv1_3,
}
# libtls's curve names for OpenSSL's.
_CURVES: Final = {"p-256": "prime256v1", "p-384": "secp384r1", "p-521": "secp521r1"}


@dataclass(frozen=True)
class ClientTls:
    """TLS towards clients: None context when client_tls_sslmode = disable."""

    sslmode: str = "disable"
    context: ssl.SSLContext | None = None
    # tls-server-end-point data of the certificate presented, for SCRAM-SHA-256-PLUS.
    channel_binding: bytes | None = None
    curve: str = ""  # the one ECDH curve allowed, when client_tls_ecdhcurve names one

    def startup(self, over_unix_socket: bool) -> StartupTls:
        """What a new connection's startup packets may do (core/client_login.py)."""
        if self.context is None or over_unix_socket:
            return StartupTls()
        return StartupTls(offered=True, required=self.sslmode in _REQUIRING)


@dataclass(frozen=True)
class ServerTls:
    """TLS towards PostgreSQL: None context when server_tls_sslmode = disable."""

    sslmode: str = "disable"
    context: ssl.SSLContext | None = None


# --- contexts from settings ----------------------------------------------------------------


def client_tls(cfg: PoolerSettings) -> ClientTls:
    """The client-side context the settings describe; SettingsError naming the key."""
    mode = cfg.client_tls_sslmode
    if cfg.auth_type == "cert":
        if mode != "verify-full":
            raise SettingsError("auth_type=cert requires client_tls_sslmode=verify-full")
        if not cfg.client_tls_ca_file:
            raise SettingsError("auth_type=cert requires client_tls_ca_file")
    if mode == "disable":
        return ClientTls()
    if not cfg.client_tls_key_file or not cfg.client_tls_cert_file:
        raise SettingsError("To allow TLS connections from clients, client_tls_key_file and "
                            "client_tls_cert_file must be set.")
    if mode == "verify-full" and not cfg.client_tls_ca_file:
        raise SettingsError("client_tls_sslmode requires client_tls_ca_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _configure(ctx, "client_tls", cfg.client_tls_protocols, cfg.client_tls_ciphers,
               cfg.client_tls13_ciphers)
    _load_chain(ctx, "client_tls", cfg.client_tls_cert_file, cfg.client_tls_key_file)
    if cfg.client_tls_ca_file:
        _load_ca(ctx, "client_tls", cfg.client_tls_ca_file)
    elif mode in _VERIFYING:
        ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    if mode in _VERIFYING:
        ctx.verify_mode = ssl.CERT_REQUIRED
    elif cfg.client_tls_ca_file:
        ctx.verify_mode = ssl.CERT_OPTIONAL  # libtls's verify_client_optional
    # PostgreSQL's ALPN name, selected when a client offers it (libpq 17+ does); direct TLS
    # requires it (ClientLogin.tls_started).
    ctx.set_alpn_protocols([ALPN_POSTGRESQL])
    curve = _set_curve(ctx, cfg.client_tls_ecdhcurve)
    _check_dheparams(cfg.client_tls_dheparams)
    return ClientTls(mode, ctx, _binding_of(cfg.client_tls_cert_file), curve)


def server_tls(cfg: PoolerSettings) -> ServerTls:
    """The server-side context the settings describe; SettingsError naming the key."""
    mode = cfg.server_tls_sslmode
    if mode == "disable":
        return ServerTls()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _configure(ctx, "server_tls", cfg.server_tls_protocols, cfg.server_tls_ciphers,
               cfg.server_tls13_ciphers)
    if mode in _VERIFYING:
        if cfg.server_tls_ca_file:
            _load_ca(ctx, "server_tls", cfg.server_tls_ca_file)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        ctx.check_hostname = mode == "verify-full"
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.server_tls_cert_file or cfg.server_tls_key_file:
        # A client certificate for PostgreSQL's `cert` authentication.
        _load_chain(ctx, "server_tls", cfg.server_tls_cert_file, cfg.server_tls_key_file)
    return ServerTls(mode, ctx)


def _configure(ctx: ssl.SSLContext, prefix: str, protocols: str, ciphers: str,
               ciphers13: str) -> None:
    low, high = _protocol_range(prefix, protocols)
    try:
        with warnings.catch_warnings():  # TLS 1.0 and 1.1 are deprecated; asked for, though
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version, ctx.maximum_version = low, high
    except (ValueError, ssl.SSLError) as exc:
        raise SettingsError(f"invalid {prefix}_protocols: {protocols}: {exc}") from None
    cipher_list = _CIPHER_WORDS.get(ciphers.strip().lower(), ciphers.strip())
    try:
        ctx.set_ciphers(cipher_list)
    except ssl.SSLError:
        raise SettingsError(f"invalid {prefix}_ciphers: {ciphers}") from None
    if ciphers13.strip():
        key = f"{prefix.replace('_tls', '_tls13')}_ciphers"
        names = [n.strip() for n in ciphers13.replace(",", ":").split(":") if n.strip()]
        if not set(names) <= _TLS13_SUITES:
            # PgBouncer's words for an OpenSSL refusal, with the key and the value.
            raise SettingsError(f"failed to set the TLSv1.3 cipher suites: invalid {key}: "
                                f"{ciphers13}")
        if set(names) != _TLS13_SUITES and not tls13_suites.restrict(ctx, names):
            raise SettingsError(
                f"{key} = {ciphers13}: this Python's ssl cannot narrow the TLS 1.3 cipher "
                f"suites; leave it empty, or restrict {prefix}_protocols to tlsv1.2 and use "
                f"{prefix}_ciphers")
    ctx.options |= ssl.OP_NO_COMPRESSION


def _protocol_range(prefix: str, text: str) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    """libtls's `secure`, `all`, `tlsv1.2,tlsv1.3`, `all,!tlsv1.0` as the (lowest, highest)
    version to allow: ssl has a range, not a set."""
    allowed: set[str] = set()
    items = [item.strip() for item in text.lower().replace(":", ",").split(",")]
    for item in [item for item in items if item] or ["secure"]:
        negate = item.startswith("!")
        word = item.lstrip("!")
        if word in ("all", "legacy"):
            names = set(TLS_VERSIONS)
        elif word in ("secure", "default"):
            names = {"tlsv1.2", "tlsv1.3"}
        else:
            names = {word}
        allowed = allowed - names if negate else allowed | names
    if not allowed:
        raise SettingsError(f"invalid {prefix}_protocols: {text} (no version left)")
    order = list(TLS_VERSIONS)
    picked = sorted(allowed, key=order.index)
    if order.index(picked[-1]) - order.index(picked[0]) + 1 != len(picked):
        raise SettingsError(f"invalid {prefix}_protocols: {text} (a gap between versions)")
    return _VERSIONS[picked[0]], _VERSIONS[picked[-1]]


def _load_chain(ctx: ssl.SSLContext, prefix: str, cert_file: str, key_file: str) -> None:
    if not cert_file or not key_file:
        raise SettingsError(f"{prefix}_cert_file and {prefix}_key_file go together")
    for key, path in (("cert_file", cert_file), ("key_file", key_file)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            # The system's words, as PgBouncer logs them ("No such file or directory").
            raise SettingsError(f"invalid {prefix}_{key}: {path}: {exc.strerror}") from None
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"invalid {prefix}_cert_file {cert_file} or {prefix}_key_file "
                            f"{key_file}: {exc}") from None


def _load_ca(ctx: ssl.SSLContext, prefix: str, ca_file: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"invalid {prefix}_ca_file: {ca_file}: {exc}") from None


def _set_curve(ctx: ssl.SSLContext, text: str) -> str:
    word = text.strip().lower()
    if word in ("", "auto", "none"):
        return ""
    if "," in word or ":" in word:
        raise SettingsError(f"invalid client_tls_ecdhcurve: {text} (Python's ssl takes "
                            "one curve, or auto)")
    name = _CURVES.get(word, text.strip())
    try:
        ctx.set_ecdh_curve(name)
    except (ValueError, ssl.SSLError):
        raise SettingsError(f"invalid client_tls_ecdhcurve: {text}") from None
    return name


def _check_dheparams(text: str) -> None:
    # OpenSSL picks DH parameters itself; libtls's keywords are accepted, nothing else.
    if text.strip().lower() not in ("", "auto", "none", "legacy"):
        raise SettingsError(f"invalid client_tls_dheparams: {text} (auto, none or legacy)")


def _binding_of(cert_file: str) -> bytes | None:
    """tls-server-end-point data of the first certificate in `cert_file` (the one sent)."""
    try:
        pem = Path(cert_file).read_text(encoding="ascii", errors="replace")
        end = pem.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")
        start = pem.index("-----BEGIN CERTIFICATE-----")
        der = ssl.PEM_cert_to_DER_cert(pem[start:end])
    except (OSError, ValueError):
        return None
    return tls_server_end_point(der)


# --- the contexts in force, and reload -----------------------------------------------------


_CLIENT_KEYS: Final = tuple(f.name for f in fields(PoolerSettings)
                            if f.name.startswith("client_tls")) + ("auth_type",)
_SERVER_KEYS: Final = tuple(f.name for f in fields(PoolerSettings)
                            if f.name.startswith("server_tls"))


class Tls:
    """The contexts in force, and the handshake counts since start (metrics)."""

    def __init__(self, cfg: PoolerSettings) -> None:
        """Raises SettingsError: at start, TLS that cannot be set up stops the pooler."""
        self.client = client_tls(cfg)
        self.server = server_tls(cfg)
        self._server_values = _values(cfg, _SERVER_KEYS)
        # Why the last reload could not set TLS up (the old contexts stay in force), or None.
        self.failure: str | None = None
        # (side, outcome) -> count: side "client" or "server", outcome "ok" or "failed".
        self.handshakes: dict[tuple[str, str], int] = {
            (side, outcome): 0 for side in ("client", "server") for outcome in ("ok", "failed")
        }

    def reload(self, cfg: PoolerSettings) -> bool:
        """Rebuild both contexts from `cfg` (files are read again: a rotated certificate
        takes effect for new connections). On any error log it and keep what is in force.
        True when the server side changed, so that servers are replaced (PgBouncer tags
        every pool dirty then)."""
        try:
            client = client_tls(cfg)
            server = server_tls(cfg)
        except SettingsError as exc:
            log.error("TLS setup failed: %s; keeping the TLS configuration in force", exc)
            self.failure = str(exc)
            return False
        self.failure = None
        self.client = client
        was_on = self.server.context is not None
        old, self.server = self._server_values, server
        self._server_values = _values(cfg, _SERVER_KEYS)
        # As PgBouncer's tls_change_requires_reconnect: off before and after is no change.
        return (was_on or server.context is not None) and old != self._server_values

    def count(self, side: str, ok: bool) -> None:
        self.handshakes[(side, "ok" if ok else "failed")] += 1


def _values(cfg: PoolerSettings, keys: tuple[str, ...]) -> tuple[object, ...]:
    return tuple(getattr(cfg, key) for key in keys)


# --- what SHOW and the login checks read ---------------------------------------------------


def connection_info(transport: asyncio.BaseTransport | None, curve: str = "") -> str:
    """PgBouncer's `tls` column: `TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519`; "" for
    plaintext. The group comes from OpenSSL (net/tls_group.py), else from
    client_tls_ecdhcurve when it allows just one; with neither, there is no ECDH part."""
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if ssl_object is None:
        return ""
    cipher = ssl_object.cipher()
    info = f"{ssl_object.version()}/{cipher[0] if cipher else ''}"
    group = negotiated_group(ssl_object) or curve
    return f"{info}/ECDH={group}" if group else info


def alpn_protocol(transport: asyncio.BaseTransport | None) -> str | None:
    """The ALPN protocol the handshake selected, None for none."""
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    return ssl_object.selected_alpn_protocol() if ssl_object is not None else None


def peer_common_names(transport: asyncio.BaseTransport | None) -> tuple[str, ...] | None:
    """The common names of the verified client certificate's subject; None without one."""
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    cert = ssl_object.getpeercert() if ssl_object is not None else None
    if not cert:
        return None
    return tuple(value for rdn in cert.get("subject", ()) for key, value in rdn
                 if key == "commonName")
