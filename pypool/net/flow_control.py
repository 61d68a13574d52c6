"""Back-pressure between a client and its server, shared by both connection kinds.

When one side's socket buffer fills (asyncio calls its `pause_writing`), the pooler stops
reading the other side until it drains (`resume_writing`), so a slow reader makes
PostgreSQL wait instead of making the pooler buffer a whole result.
"""

from __future__ import annotations

import asyncio


class ReadingSwitch(asyncio.BaseProtocol):
    """Pause and resume reading one transport, idempotently. A base of the connections'
    records (net/records.py), so that what takes a record may hand it to asyncio as the
    connection's protocol (the TLS handshakes do)."""

    transport: asyncio.Transport | None
    _reading_paused: bool

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
