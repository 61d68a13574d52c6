"""Cancel keys as PgBouncer's peering lays them out, so that a peer can route a cancel.

A BackendKeyData carries 8 bytes: a process id (Int32) then a secret key (Int32). Poolers
behind one load balancer (PgBouncer 1.19+ `[peers]`, and pypool's `workers`) receive each
other's CancelRequests, so the key says whose it is. With `peer_id` > 0, PgBouncer writes:

    byte 0      random, sign bit clear (the pid must look positive: pg_basebackup)
    bytes 1, 2  peer_id, low byte first
    byte 3      random; pypool puts its worker number here when `workers` > 1
    bytes 4..7  random, except the two low bits of byte 7: the TTL, 3 when issued

A pooler that receives a key with another peer_id forwards it to that peer with the TTL
one lower, and drops it once the TTL is 0, so a misconfigured ring cannot loop for ever.
The owner compares keys with the TTL bits set back to 3. This leaves 45 random bits (37
with workers), enough that a key cannot be guessed in practice.

Pure arithmetic on the two Int32s, as they are on the wire.
"""

from __future__ import annotations

from typing import Final

TTL_MASK: Final[int] = 0x03  # the low two bits of the secret's last byte (byte 7)
NO_WORKER: Final[int] = -1


def issue(pid: int, secret: int, peer_id: int, worker: int = NO_WORKER) -> tuple[int, int]:
    """The key to hand a client, from 31 random bits `pid` and 32 random bits `secret`:
    unchanged when `peer_id` is 0 and there is no worker number, else with them and a
    full TTL written in."""
    if peer_id > 0:
        pid = (pid & 0x7F0000FF) | (peer_id & 0xFF) << 16 | (peer_id >> 8 & 0xFF) << 8
        secret |= TTL_MASK
    if worker != NO_WORKER:
        pid = (pid & 0x7FFFFF00) | (worker & 0xFF)
    return pid, secret


def peer_of(pid: int) -> int:
    """The peer_id a key was issued by (bytes 1 and 2 of the key)."""
    return (pid >> 16 & 0xFF) | (pid >> 8 & 0xFF) << 8


def worker_of(pid: int) -> int:
    """The worker number a key was issued by, when the issuer has `workers` > 1."""
    return pid & 0xFF


def ttl(secret: int) -> int:
    """How many more times a pooler may forward this key."""
    return secret & TTL_MASK


def forwarded(secret: int) -> int:
    """The secret to send on to a peer: the TTL one lower (the caller checks it is > 0)."""
    return secret - 1


def as_issued(secret: int) -> int:
    """The secret as the owner stored it (TTL back to 3), to look a forwarded key up."""
    return secret | TTL_MASK
