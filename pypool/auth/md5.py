"""PostgreSQL's md5 password scheme: md5(md5(password || user) || salt), hex, prefixed "md5"."""

from __future__ import annotations

import hashlib


def md5_hash(password: str, user: str) -> str:
    """The stored form, as pg_authid and userlist.txt hold it: "md5" + 32 hex digits."""
    return "md5" + hashlib.md5((password + user).encode()).hexdigest()


def is_md5_hash(secret: str) -> bool:
    return len(secret) == 35 and secret.startswith("md5")


def md5_response(stored: str, salt: bytes) -> str:
    """What a client sends for AuthenticationMD5Password, from the stored hash and the salt."""
    return "md5" + hashlib.md5(stored[3:].encode() + salt).hexdigest()


def md5_response_from_secret(secret: str, user: str, salt: bytes) -> str:
    stored = secret if is_md5_hash(secret) else md5_hash(secret, user)
    return md5_response(stored, salt)
