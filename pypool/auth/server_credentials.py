"""What the pooler logs into PostgreSQL with, for one user.

A server login (core/server_login.py) answers PostgreSQL's challenge with whatever the
pooler has for the user: a plaintext password (from the [databases] entry, or the
auth_file), an md5 hash, or a SCRAM verifier with, once a client has logged in with SCRAM,
the ClientKey recovered from its proof (auth/scram.py). `from_secret` sorts an auth_file
or auth_query secret into the right field.

Never here: where the secret comes from (pooler/record.py), the exchange itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from .md5 import is_md5_hash
from .scram import ScramVerifier, is_scram_verifier


@dataclass
class ServerCredentials:
    """What the pooler has to log into PostgreSQL as `user`."""

    user: str
    password: str | None = None
    md5_hash: str | None = None
    verifier: ScramVerifier | None = None
    scram_client_key: bytes | None = None


def from_secret(user: str, secret: str | None,
                scram_client_key: bytes | None) -> ServerCredentials:
    """`user`'s credentials from its auth_file or auth_query secret (None: none known);
    the ClientKey is used only with a SCRAM verifier."""
    creds = ServerCredentials(user)
    if secret is None:
        return creds
    if is_scram_verifier(secret):
        creds.verifier = ScramVerifier.parse(secret)
        creds.scram_client_key = scram_client_key
    elif is_md5_hash(secret):
        creds.md5_hash = secret
    else:
        creds.password = secret
    return creds
