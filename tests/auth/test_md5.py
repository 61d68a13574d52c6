"""PostgreSQL's md5 password scheme, checked against known values."""

from __future__ import annotations

import hashlib

import pytest

from pypool.auth.md5 import is_md5_hash, md5_hash, md5_response, md5_response_from_secret

pytestmark = pytest.mark.timeout(10)


def test_md5_hash_is_what_pg_authid_stores() -> None:
    # SELECT 'md5' || md5('app-secret' || 'app')
    assert md5_hash("app-secret", "app") == "md5" + hashlib.md5(b"app-secretapp").hexdigest()
    # A well-known value: password "postgres" for user "postgres".
    assert md5_hash("postgres", "postgres") == "md53175bce1d3201d16594cebf9d7eb3f9d"


def test_is_md5_hash() -> None:
    assert is_md5_hash(md5_hash("x", "y"))
    assert not is_md5_hash("md5")
    assert not is_md5_hash("md5" + "0" * 31)
    assert not is_md5_hash("plaintext-of-35-characters-long!!!!")
    assert not is_md5_hash("SCRAM-SHA-256$4096:abc$def:ghi")


def test_md5_response_matches_libpq() -> None:
    # libpq: "md5" + md5(hex(md5(password + user)) + salt)
    salt = b"\x01\x02\x03\x04"
    inner = hashlib.md5(b"app-secretapp").hexdigest().encode()
    expected = "md5" + hashlib.md5(inner + salt).hexdigest()
    assert md5_response(md5_hash("app-secret", "app"), salt) == expected
    assert md5_response_from_secret("app-secret", "app", salt) == expected
    assert md5_response_from_secret(md5_hash("app-secret", "app"), "app", salt) == expected


def test_salt_and_user_matter() -> None:
    stored = md5_hash("pw", "alice")
    assert md5_response(stored, b"aaaa") != md5_response(stored, b"aaab")
    assert md5_hash("pw", "alice") != md5_hash("pw", "bob")
