"""What the Pooler holds of its replication clients (pooler/replication.py): which server logs
in for whom, and the joined pairs. (Who waits for a dedicated server is each pool's own:
`Pool.replication_waiting`.)

Plain data, apart so that the Pooler's fields (pooler/record.py) can name it without
importing the module that acts on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..net.records import ClientRecord, ServerRecord
    from ..net.replication_pipe import ReplicationPipe


class Replication:
    """The replication clients of one Pooler that do not yet have a server running."""

    def __init__(self) -> None:
        # Dedicated servers logging in, and the client each is for (and the other way).
        self.pending: dict[ServerRecord, ClientRecord] = {}
        self.pending_for: dict[ClientRecord, ServerRecord] = {}
        # Joined pairs, by either connection.
        self.pipes: dict[object, ReplicationPipe] = {}

    def in_use(self) -> bool:
        """Whether any replication client has a server, or one logging in for it (with
        `Pool.replication_waiting`, the hooks cost nothing otherwise)."""
        return bool(self.pending or self.pipes)
