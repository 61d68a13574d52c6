"""A takeover under way in the new process (pooler/takeover.py): the connection to the old
process and the listening sockets it passed.

Plain data, apart so that the Pooler's fields (pooler/record.py) can name it without
importing the module that acts on it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field


@dataclass
class Takeover:
    """A takeover under way, in the new process: the connection to the old one and the
    sockets it passed."""

    conn: socket.socket
    # "ready" has gone to the old process: cancels may follow it on `conn` (not before, or
    # the old process would read one as the answer it waits for).
    ready: bool = False
    tcp: list[socket.socket] = field(default_factory=list)
    unix: socket.socket | None = None
    takeover: socket.socket | None = None
