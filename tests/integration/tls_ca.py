"""A throwaway certificate authority for the TLS tests, made with `cryptography`.

`CertificateAuthority(directory, name)` writes its root (`ca.crt`) and issues certificates
for servers (host names and addresses in subjectAltName) and clients (the user in the
common name), each as a PEM `.crt` and `.key` pair. EC P-256 keys: quick to make, and their
ecdsa-with-SHA256 signature gives SCRAM's tls-server-end-point binding a SHA-256 hash.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


class CertificateAuthority:
    def __init__(self, directory: Path, name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = _name(name)
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(self.name).issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.root = directory / "ca.crt"
        self.root.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, stem: str, common_name: str, hosts: tuple[str, ...] = (),
              client: bool = False) -> Issued:
        """A certificate signed by this CA: for a server naming `hosts` (DNS names or IP
        addresses), or for a client (`client`) whose common name is the user."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]),
                critical=False)
        )
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, issued.key)
        return issued


@dataclass(frozen=True)
class Certificates:
    ca: CertificateAuthority
    server: Issued  # pypool's, for localhost and 127.0.0.1
    client: Issued  # CN=app
    other_ca: CertificateAuthority
    other_server: Issued  # pypool's, signed by the other CA
    other_client: Issued  # CN=app, signed by the other CA
    postgres: Issued  # PostgreSQL's (test_tls_server.py): for 127.0.0.1 only, not localhost


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    base = tmp_path_factory.mktemp("tls")
    ca = CertificateAuthority(base / "ca1", "pypool test CA 1")
    other = CertificateAuthority(base / "ca2", "pypool test CA 2")
    return Certificates(
        ca, ca.issue("server", "localhost", ("localhost", "127.0.0.1")),
        ca.issue("client-app", "app", client=True),
        other, other.issue("server", "localhost", ("localhost", "127.0.0.1")),
        other.issue("client-app", "app", client=True),
        ca.issue("postgres", "127.0.0.1", ("127.0.0.1",)),
    )


def tls_settings(certs: Certificates, mode: str = "prefer", **more: str) -> dict[str, str]:
    """The ini keys for client TLS with `certs`: pypool's certificate, the CA that
    verifies clients', client_tls_sslmode `mode`."""
    return {"client_tls_sslmode": mode, "client_tls_cert_file": str(certs.server.cert),
            "client_tls_key_file": str(certs.server.key),
            "client_tls_ca_file": str(certs.ca.root), **more}
