"""The TLS contexts net/tls.py builds from the settings, their refusals with PgBouncer's
texts, and reload keeping what is in force when a file is bad."""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path

import pytest

from pypool.net import tls
from pypool.settings import PoolerSettings, SettingsError
from tests.integration.tls_ca import Certificates, certs

pytestmark = pytest.mark.timeout(30)
__all__ = ["certs"]


def client_cfg(certs: Certificates, mode: str = "require", **more: object) -> PoolerSettings:
    return PoolerSettings(client_tls_sslmode=mode, client_tls_cert_file=str(certs.server.cert),
                          client_tls_key_file=str(certs.server.key),
                          client_tls_ca_file=str(certs.ca.root), **more)  # type: ignore[arg-type]


def test_the_defaults_are_pgbouncers() -> None:
    found = tls.Tls(PoolerSettings())
    assert found.client.context is None
    assert found.server.sslmode == "prefer" and found.server.context is not None
    assert found.server.context.verify_mode == ssl.CERT_NONE


def test_disable_builds_no_context() -> None:
    found = tls.Tls(PoolerSettings(server_tls_sslmode="disable"))
    assert found.client.context is None and found.server.context is None
    assert found.client.startup(over_unix_socket=False) == tls.StartupTls()


@pytest.mark.parametrize(("mode", "verify", "required"), [
    ("allow", ssl.CERT_OPTIONAL, False), ("prefer", ssl.CERT_OPTIONAL, False),
    ("require", ssl.CERT_OPTIONAL, True), ("verify-ca", ssl.CERT_REQUIRED, True),
    ("verify-full", ssl.CERT_REQUIRED, True),
])
def test_client_modes(certs: Certificates, mode: str, verify: ssl.VerifyMode,
                      required: bool) -> None:
    found = tls.client_tls(client_cfg(certs, mode))
    assert found.context is not None and found.context.verify_mode == verify
    assert found.startup(over_unix_socket=False) == tls.StartupTls(offered=True,
                                                                   required=required)
    assert found.startup(over_unix_socket=True) == tls.StartupTls()
    assert found.channel_binding is not None and len(found.channel_binding) == 32
    assert found.context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_without_a_ca_file_a_client_certificate_is_not_asked_for(certs: Certificates) -> None:
    found = tls.client_tls(dataclasses.replace(client_cfg(certs), client_tls_ca_file=""))
    assert found.context is not None and found.context.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(("changes", "text"), [
    ({"client_tls_key_file": ""}, "To allow TLS connections from clients, client_tls_key_file "
                                  "and client_tls_cert_file must be set."),
    ({"client_tls_sslmode": "verify-full", "client_tls_ca_file": ""},
     "client_tls_sslmode requires client_tls_ca_file"),
    ({"auth_type": "cert"}, "auth_type=cert requires client_tls_sslmode=verify-full"),
    ({"auth_type": "cert", "client_tls_sslmode": "verify-full", "client_tls_ca_file": ""},
     "auth_type=cert requires client_tls_ca_file"),
    ({"client_tls_ciphers": "NOSUCHCIPHER"}, "invalid client_tls_ciphers: NOSUCHCIPHER"),
    ({"client_tls_protocols": "tlsv1.1,tlsv1.3"}, "a gap between versions"),
    ({"client_tls_protocols": "!tlsv1.2,!tlsv1.3"}, "no version left"),
    ({"client_tls13_ciphers": "NOPE"},
     "failed to set the TLSv1.3 cipher suites: invalid client_tls13_ciphers: NOPE"),
    ({"client_tls_ecdhcurve": "P-256:P-384"}, "takes one curve"),
    ({"client_tls_ecdhcurve": "nosuchcurve"}, "invalid client_tls_ecdhcurve"),
    ({"client_tls_dheparams": "/etc/dh.pem"}, "invalid client_tls_dheparams"),
    ({"client_tls_cert_file": "/nonexistent.crt"},
     "invalid client_tls_cert_file: /nonexistent.crt: No such file or directory"),
    ({"client_tls_key_file": "/"}, "invalid client_tls_key_file: /: Is a directory"),
    ({"client_tls_ca_file": "/nonexistent-ca.crt"}, "invalid client_tls_ca_file"),
])
def test_client_refusals(certs: Certificates, changes: dict[str, str], text: str) -> None:
    with pytest.raises(SettingsError) as info:
        tls.client_tls(dataclasses.replace(client_cfg(certs), **changes))  # type: ignore[arg-type]
    assert text in str(info.value)


def test_protocols_and_ciphers(certs: Certificates) -> None:
    found = tls.client_tls(client_cfg(certs, client_tls_protocols="tlsv1.3",
                                      client_tls_ciphers="fast", client_tls_ecdhcurve="P-256"))
    assert found.context is not None
    assert found.context.minimum_version == found.context.maximum_version == \
        ssl.TLSVersion.TLSv1_3
    assert found.curve == "prime256v1"
    every = tls.client_tls(client_cfg(certs, client_tls_protocols="all:!tlsv1.0"))
    assert every.context is not None
    assert every.context.minimum_version == ssl.TLSVersion.TLSv1_1


@pytest.mark.parametrize(("mode", "verify", "hostname"), [
    ("allow", ssl.CERT_NONE, False), ("prefer", ssl.CERT_NONE, False),
    ("require", ssl.CERT_NONE, False), ("verify-ca", ssl.CERT_REQUIRED, False),
    ("verify-full", ssl.CERT_REQUIRED, True),
])
def test_server_modes(certs: Certificates, mode: str, verify: ssl.VerifyMode,
                      hostname: bool) -> None:
    found = tls.server_tls(PoolerSettings(server_tls_sslmode=mode,
                                          server_tls_ca_file=str(certs.ca.root)))
    assert found.context is not None
    assert (found.context.verify_mode, found.context.check_hostname) == (verify, hostname)


def test_reload_keeps_the_contexts_in_force_on_a_bad_file(
        certs: Certificates, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = client_cfg(certs)
    found = tls.Tls(cfg)
    before = found.client
    assert not found.reload(dataclasses.replace(cfg, client_tls_key_file=str(tmp_path / "gone")))
    assert found.client is before
    assert "TLS setup failed: " in caplog.text
    assert "keeping the TLS configuration in force" in caplog.text
    assert found.failure is not None and "gone" in found.failure
    # A good reload replaces the client context; the server side is unchanged: no recycling.
    assert found.reload(cfg) is False
    assert found.client is not before
    assert found.reload(dataclasses.replace(cfg, server_tls_sslmode="require")) is True
    assert found.server.context is not None


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[str, str, int] | None:
    """A TLS handshake in memory; the cipher the server side agreed on."""
    bios = [ssl.MemoryBIO() for _ in range(4)]
    srv = server.wrap_bio(bios[0], bios[1], server_side=True)
    cli = client.wrap_bio(bios[2], bios[3], server_hostname="localhost")
    for _ in range(10):
        for side in (cli, srv):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        if bios[3].pending:
            bios[0].write(bios[3].read())
        if bios[1].pending:
            bios[2].write(bios[1].read())
    return srv.cipher()


@pytest.mark.parametrize("suite", ["TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_256_GCM_SHA384"])
def test_tls13_ciphers_narrow_the_suites(certs: Certificates, suite: str) -> None:
    """client_tls13_ciphers as PgBouncer's test_client_ssl_set_ciphers_for_tls_v1_3 sets it:
    the one suite named is the one a TLS 1.3 handshake agrees on, whatever the client
    prefers (it offers all three)."""
    found = tls.client_tls(client_cfg(certs, client_tls_protocols="tlsv1.3",
                                      client_tls13_ciphers=suite))
    assert found.context is not None
    suites = [c["name"] for c in found.context.get_ciphers() if c["protocol"] == "TLSv1.3"]
    assert suites == [suite]
    client = ssl.create_default_context(cafile=str(certs.ca.root))
    cipher = _handshake(found.context, client)
    assert cipher is not None and cipher[0] == suite and cipher[1] == "TLSv1.3"


def test_tls13_ciphers_for_servers_too(certs: Certificates) -> None:
    found = tls.server_tls(PoolerSettings(server_tls_sslmode="require",
                                          server_tls13_ciphers="TLS_AES_128_GCM_SHA256"))
    assert found.context is not None
    assert [c["name"] for c in found.context.get_ciphers()
            if c["protocol"] == "TLSv1.3"] == ["TLS_AES_128_GCM_SHA256"]


def test_where_suites_cannot_be_narrowed_the_key_is_refused(
        certs: Certificates, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Python whose contexts do not check out (net/tls13_suites.py): the key is
    refused with the reason, as before it could be honoured; all three suites are fine."""
    monkeypatch.setattr(tls.tls13_suites, "restrict", lambda ctx, suites: False)
    with pytest.raises(SettingsError, match="cannot narrow the TLS 1.3 cipher suites"):
        tls.client_tls(client_cfg(certs, client_tls13_ciphers="TLS_AES_128_GCM_SHA256"))
    every = "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256"
    assert tls.client_tls(client_cfg(certs, client_tls13_ciphers=every)).context is not None
