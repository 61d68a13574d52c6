"""A peer pool: the CancelRequests on their way to one `[peers]` entry (SHOW PEER_POOLS).

PgBouncer keeps, for each peer, a pool of connections that only ever carry a forwarded
CancelRequest: at most the peer's `pool_size` at once, the rest queued. This is that pool's
bookkeeping, without the sockets (pooler/peers.py opens them): a cancel is `waiting` until
a slot is free, `login` while its connection opens, `active` once sent, until the peer
closes the connection (it has passed the cancel on).

A cancel waits only for other cancels to the same peer, never for a client's server.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class PeerPool:
    peer_id: int
    login: int = 0  # connecting to the peer (sv_login)
    active: int = 0  # sent, the peer has not closed yet (cl_active_cancel_req, sv_active_cancel)
    waiting: deque[tuple[int, int]] = field(default_factory=deque)  # keys behind pool_size

    def take_slot(self, size: int) -> bool:
        """Whether one more cancel may open its connection now (counted in `login`)."""
        if self.login + self.active >= max(size, 1):
            return False
        self.login += 1
        return True

    def sent(self) -> None:
        self.login -= 1
        self.active += 1

    def done(self, was_sent: bool) -> tuple[int, int] | None:
        """Free the slot; the next waiting key, which now holds it (in `login`), if any."""
        if was_sent:
            self.active -= 1
        else:
            self.login -= 1
        if not self.waiting:
            return None
        self.login += 1
        return self.waiting.popleft()

    @property
    def idle(self) -> bool:
        return not (self.login or self.active or self.waiting)
