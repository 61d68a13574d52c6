"""LISTEN/NOTIFY shared by a pool's clients (listen_mode = shared): which client listens on
which channel, what the pool's one listening server connection must be asked, and to whom
each NotificationResponse it receives goes.

Theory of operation. In transaction mode a client's LISTEN runs on whatever server it has
for that transaction, and that server goes back to the pool afterwards; it cannot be the one
that hears the channel. So each pool (database, user) with listeners keeps one more server
connection of its own, the listening connection, that LISTENs on the union of its clients'
channels. A client's interest in a channel starts when its LISTEN goes by (`want`): the
listening connection is asked at once, so that it listens by the time the client's
transaction commits (what a client is given, and when, is pooler/notifications.py's).
UNLISTEN, UNLISTEN *, DISCARD ALL and the client leaving take the interest away (at their
commit, the last at once); a channel nobody wants any more is UNLISTENed.

`feed(data)` reads what the listening connection sends and returns the notifications to hand
on, each as (channel, the NotificationResponse as it came); `requests()` returns the LISTEN
and UNLISTEN Queries to write now (one at a time per channel, each its own Query so one
failure fails nothing else). When the connection is lost (`lost`) every channel must be
LISTENed again on the next one, and the clients that listened are told (by the caller) that
notifications may have been missed in between.

Plain data and bytes: never touches a socket and never writes to a client. Clients are
opaque keys here (the network layer's connections).
"""

from __future__ import annotations

import logging
from typing import Final

from ..protocol import messages as m
from ..protocol.framing import be32

log = logging.getLogger("pypool.listen")

# The listening connection's life (SHOW LISTENERS `state`).
CONNECTING: Final = "connecting"
LISTENING: Final = "listening"
LOST: Final = "lost"  # gone; the next one is opened after a pause

# PostgreSQL truncates identifiers (and so channel names) to NAMEDATALEN - 1 bytes.
_NAMEDATALEN: Final = 64


def channel_name(token: bytes) -> bytes:
    """The channel a LISTEN's operand names, as PostgreSQL spells it in a notification: a
    bare word folded to lower case (the tokenizer did), a quoted one as written."""
    if token[:1] == b'"' and token[-1:] == b'"' and len(token) > 1:
        token = token[1:-1].replace(b'""', b'"')
    return token[: _NAMEDATALEN - 1]


def quote_channel(channel: bytes) -> bytes:
    """A channel as an SQL identifier: always quoted, so case and odd bytes survive."""
    return b'"' + channel.replace(b'"', b'""') + b'"'


class Listening:
    """One pool's channels: who wants them and what its listening connection holds."""

    def __init__(self) -> None:
        # channel -> the clients that want it (listening, or a LISTEN not yet committed).
        self.wanted: dict[bytes, dict[object, None]] = {}
        # client -> the channels it wants (the other side of `wanted`).
        self.wants: dict[object, frozenset[bytes]] = {}
        self.listened: set[bytes] = set()  # LISTENed on the connection, confirmed
        self.asked: list[tuple[bool, bytes]] = []  # (listen?, channel) sent, not yet answered
        self.state = LOST
        self.connected = False  # logged in: requests may be written
        self.backend_pid = 0  # of the connection, once logged in
        self.received = 0  # NotificationResponses the connection received
        self.losses = 0  # times the connection was lost while clients listened
        self.failed = 0  # LISTEN / UNLISTEN the server refused
        self.error = ""  # the last ErrorResponse not answering a request (a FATAL, mostly)
        self._partial = b""
        # The network layer's: its connection (net/listen_server.py), when to open the next
        # one after a failure, and the clients told of a loss (told again once it is back).
        self.connection: object | None = None
        self.retry_at = 0.0
        self.retry_scheduled = False
        self.told: list[object] = []
        self.bridging: dict[object, None] = {}  # clients that keep their server meanwhile

    # --- clients ------------------------------------------------------------------------

    def want(self, client: object, channels: frozenset[bytes]) -> None:
        """`client` wants exactly `channels` from now on (empty: nothing, it may go)."""
        old = self.wants.get(client, frozenset())
        if old == channels:
            return
        for channel in old - channels:
            holders = self.wanted.get(channel)
            if holders is not None:
                holders.pop(client, None)
                if not holders:
                    del self.wanted[channel]
        for channel in channels - old:
            self.wanted.setdefault(channel, {})[client] = None
        if channels:
            self.wants[client] = channels
        else:
            self.wants.pop(client, None)

    def receivers(self, channel: bytes) -> list[object]:
        """The clients that want `channel` now (each decides whether it is committed)."""
        holders = self.wanted.get(channel)
        return list(holders) if holders else []

    def idle(self) -> bool:
        """Nobody wants anything and the connection holds nothing: it may be closed."""
        return not self.wanted and not self.asked and not self.listened

    # --- the listening connection -------------------------------------------------------

    def requests(self) -> bytes:
        """The Queries to write now: a LISTEN for each channel wanted and not held, an
        UNLISTEN for each held and no longer wanted; b"" when there is nothing to ask (or
        no connection to ask)."""
        if not self.connected:
            return b""
        in_flight = {channel for _, channel in self.asked}
        out: list[bytes] = []
        for channel in self.wanted:
            if channel not in self.listened and channel not in in_flight:
                self.asked.append((True, channel))
                out.append(m.message(m.QUERY, b"LISTEN " + quote_channel(channel) + b"\0"))
        for channel in self.listened:
            if channel not in self.wanted and channel not in in_flight:
                self.asked.append((False, channel))
                out.append(m.message(m.QUERY, b"UNLISTEN " + quote_channel(channel) + b"\0"))
        return b"".join(out)

    def logged_in(self) -> None:
        self.connected = True
        self.state = LISTENING

    def lost(self) -> list[object]:
        """The connection is gone: nothing is listened any more. Returns the clients that
        wanted a channel (they may have missed notifications)."""
        self.connected = False
        self.state = LOST
        self.listened.clear()
        self.asked.clear()
        self._partial = b""
        self.error = ""
        if self.wants:
            self.losses += 1
        return list(self.wants)

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """What the connection sent: returns the notifications in it, in order, as
        (channel, NotificationResponse)."""
        if self._partial:
            data = self._partial + data
            self._partial = b""
        found: list[tuple[bytes, bytes]] = []
        pos = 0
        n = len(data)
        while n - pos >= 5:
            end = pos + 1 + be32(data, pos + 1)
            if end > n:
                break
            kind = data[pos]
            if kind == m.NOTIFICATION_RESPONSE:
                # Int32 pid, String channel, String payload.
                stop = data.index(b"\0", pos + 9, end)
                found.append((data[pos + 9 : stop], data[pos:end]))
                self.received += 1
            elif kind == m.READY_FOR_QUERY:
                self._answered()
            elif kind == m.ERROR_RESPONSE:
                fields = m.parse_error_fields(data[pos + 5 : end])
                if fields.get("S") in ("FATAL", "PANIC") or not self.asked:
                    self.error = f"{fields.get('S', 'ERROR')} {fields.get('M', '')}"
                elif self.asked:
                    self.failed += 1
                    listen, channel = self.asked[0]
                    self.asked[0] = (listen, b"")  # not held, whatever it was
                    log.warning("listening connection: %s %r failed: %s %s",
                                "LISTEN" if listen else "UNLISTEN", channel,
                                fields.get("C"), fields.get("M"))
            pos = end
        if pos < n:
            self._partial = data[pos:]
        return found

    def _answered(self) -> None:
        """The ReadyForQuery of the oldest request: what it asked holds now."""
        if not self.asked:
            return
        listen, channel = self.asked.pop(0)
        if not channel:
            return  # it failed
        if listen:
            self.listened.add(channel)
        else:
            self.listened.discard(channel)
