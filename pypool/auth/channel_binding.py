"""SCRAM channel binding: the `tls-server-end-point` data of a certificate (RFC 5929).

SCRAM-SHA-256-PLUS ties a login to the TLS connection it runs on: both ends put a hash of
the server's certificate into the SCRAM proof, so a man in the middle holding another
certificate cannot relay the exchange. The hash is the one the certificate's own signature
uses, SHA-256 in place of MD5 and SHA-1 (RFC 5929 section 4.1), as PostgreSQL computes it.

`tls_server_end_point` reads just enough DER to find the signature algorithm, so that
nothing beyond the standard library is needed. A certificate whose algorithm names no single
hash (RSASSA-PSS, Ed25519) has no binding here, and PostgreSQL offers none for it either:
None, and the pooler then offers SCRAM-SHA-256 alone. Never here: sockets, ssl objects.
"""

from __future__ import annotations

import hashlib
from typing import Final

CHANNEL_BINDING_TYPE: Final = "tls-server-end-point"

# Signature algorithm OID -> the hash of its certificate's end point.
_HASH_BY_SIGNATURE: Final = {
    "1.2.840.113549.1.1.4": "sha256",  # md5WithRSAEncryption: MD5 becomes SHA-256
    "1.2.840.113549.1.1.5": "sha256",  # sha1WithRSAEncryption: SHA-1 becomes SHA-256
    "1.2.840.113549.1.1.11": "sha256",
    "1.2.840.113549.1.1.12": "sha384",
    "1.2.840.113549.1.1.13": "sha512",
    "1.2.840.113549.1.1.14": "sha224",
    "1.2.840.10045.4.1": "sha256",  # ecdsa-with-SHA1
    "1.2.840.10045.4.3.1": "sha224",
    "1.2.840.10045.4.3.2": "sha256",
    "1.2.840.10045.4.3.3": "sha384",
    "1.2.840.10045.4.3.4": "sha512",
    "1.2.840.10040.4.3": "sha256",  # dsa-with-sha1
    "2.16.840.1.101.3.4.3.2": "sha256",  # dsa-with-sha256
}


def tls_server_end_point(der: bytes) -> bytes | None:
    """The channel-binding data of the DER certificate `der`, or None when its signature
    algorithm names no hash to use (or it is not a certificate)."""
    try:
        oid = _signature_algorithm(der)
    except (IndexError, ValueError):
        return None
    name = _HASH_BY_SIGNATURE.get(oid)
    return hashlib.new(name, der).digest() if name is not None else None


def _signature_algorithm(der: bytes) -> str:
    """Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }: the OID
    that opens signatureAlgorithm, dotted."""
    tag, start, _ = _element(der, 0)
    if tag != 0x30:
        raise ValueError("not a SEQUENCE")
    _, tbs_start, tbs_end = _element(der, start)  # tbsCertificate, skipped
    del tbs_start
    tag, alg_start, _ = _element(der, tbs_end)
    if tag != 0x30:
        raise ValueError("no AlgorithmIdentifier")
    tag, oid_start, oid_end = _element(der, alg_start)
    if tag != 0x06:
        raise ValueError("no OBJECT IDENTIFIER")
    return _dotted(der[oid_start:oid_end])


def _element(der: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the DER element at `pos`."""
    tag = der[pos]
    length = der[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 4:
            raise ValueError("bad DER length")
        length = int.from_bytes(der[pos : pos + count], "big")
        pos += count
    if pos + length > len(der):
        raise ValueError("DER element runs past the end")
    return tag, pos, pos + length


def _dotted(body: bytes) -> str:
    if not body:
        raise ValueError("empty OID")
    parts = [body[0] // 40, body[0] % 40] if body[0] < 80 else [2, body[0] - 80]
    value = 0
    for byte in body[1:]:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            parts.append(value)
            value = 0
    return ".".join(str(part) for part in parts)
