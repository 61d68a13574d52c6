"""TLS records of at most 8 KiB towards clients, as PostgreSQL sends them.

OpenSSL cuts what one write hands it into records of up to 16 KiB of plaintext. PostgreSQL
never writes more than its 8 KiB send buffer at a time, so its records to clients are at
most 8 KiB, and libpq has come to depend on it: each read asks OpenSSL for at least 8 KiB
(pqReadData keeps that much room), and when no whole message has come yet, libpq's callers
wait on the socket. A record larger than the room is decrypted in full but handed over only
in part; its tail stays inside OpenSSL, where no poll of the socket can see it. While the
stream goes on, the next record wakes the client and the tail is read with it; at the end of
a stream nothing comes next and the client waits forever. Seen through the pooler: with
`pg_basebackup -X stream` (PostgreSQL 15), the WAL-streaming process sent CopyDone, the
walsender answered and went idle, every socket queue was empty, and the child waited in
select() for the answer that was inside its own OpenSSL buffer.

So a client's TLS transport is wrapped in `RecordSized`, which hands the TLS layer a write
larger than 8 KiB as pieces of 8 KiB: one record each. Writes of 8 KiB or less, nearly all
of them, go through as they are. The unix socket and plain TCP never do TLS and are not
wrapped; PostgreSQL's own reads (the pooler's server side) do not wait on the socket while
OpenSSL holds data, so servers are not wrapped either.

Never here: the handshake (tls.py), what is written.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

# PostgreSQL's PQ_SEND_BUFFER_SIZE, and the room libpq keeps for each read.
RECORD_MAX: Final = 8192


class RecordSized(asyncio.Transport):
    """A client's TLS transport, written to in records of at most RECORD_MAX bytes."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) <= RECORD_MAX:
            self.inner.write(data)
            return
        # The TLS layer encrypts each piece as it is handed over; bytes keep the pieces from
        # changing under it should a caller reuse its buffer.
        view = memoryview(data if isinstance(data, bytes) else bytes(data))
        self.inner.writelines([view[at:at + RECORD_MAX]
                               for at in range(0, len(view), RECORD_MAX)])

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    # The rest is the TLS transport's own.

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.inner.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.inner.get_protocol()  # type: ignore[no-any-return]

    def is_closing(self) -> bool:
        return self.inner.is_closing()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()

    def pause_reading(self) -> None:
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.inner.resume_reading()

    def is_reading(self) -> bool:
        return self.inner.is_reading()  # type: ignore[no-any-return]

    def write_eof(self) -> None:
        self.inner.write_eof()

    def can_write_eof(self) -> bool:
        return self.inner.can_write_eof()  # type: ignore[no-any-return]

    def get_write_buffer_size(self) -> int:
        return self.inner.get_write_buffer_size()  # type: ignore[no-any-return]

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.inner.get_write_buffer_limits()  # type: ignore[no-any-return]

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.inner.set_write_buffer_limits(high, low)
