"""tls-server-end-point data (auth/channel_binding.py) against scramp's own, for the
signature algorithms certificates use, and None where no hash is named."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID
from scramp.core import CBindData

from pypool.auth.channel_binding import tls_server_end_point

pytestmark = pytest.mark.timeout(30)


def certificate(key, algorithm) -> bytes:  # type: ignore[no-untyped-def]
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "db")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(7)
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, algorithm))
    return cert.public_bytes(serialization.Encoding.DER)


RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC = ec.generate_private_key(ec.SECP256R1())


@pytest.mark.parametrize(
    ("key", "algorithm"),
    [(RSA, hashes.SHA256()), (RSA, hashes.SHA384()), (RSA, hashes.SHA512()),
     (EC, hashes.SHA256()), (EC, hashes.SHA384()), (RSA, hashes.SHA224())],
)
def test_the_hash_is_the_signature_hash(key, algorithm) -> None:  # type: ignore[no-untyped-def]
    der = certificate(key, algorithm)
    assert tls_server_end_point(der) == CBindData.from_der(der).data


def test_no_binding_without_a_single_hash() -> None:
    assert tls_server_end_point(certificate(ed25519.Ed25519PrivateKey.generate(), None)) is None
    assert tls_server_end_point(b"") is None
    assert tls_server_end_point(b"\x30\x82\xff\xff") is None
    assert tls_server_end_point(b"not a certificate") is None
