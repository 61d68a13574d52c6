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

So a write of more than 8 KiB to a client over TLS goes to the TLS layer as pieces of
8 KiB (`write_in_records`), one record each. The two places that write bulk to clients do
it: `ClientConnection.write` (every reply, the console's output) and the replication pipe.
Writes of 8 KiB or less, nearly all of them, are one `len()` away from the plain write.
The unix socket and plain TCP never do TLS; PostgreSQL's own reads (the pooler's server
side) do not wait on the socket while OpenSSL holds data, so servers need none of this.

Never here: the handshake (tls.py), what is written.
"""

from __future__ import annotations

from typing import Any, Final

# PostgreSQL's PQ_SEND_BUFFER_SIZE, and the room libpq keeps for each read.
RECORD_MAX: Final = 8192


def write_in_records(transport: Any, data: bytes | bytearray | memoryview) -> None:
    """Hand `data` (more than RECORD_MAX bytes) to a TLS transport in RECORD_MAX pieces."""
    # The TLS layer encrypts each piece as it is handed over; bytes keep the pieces from
    # changing under it should a caller reuse its buffer.
    view = memoryview(data if isinstance(data, bytes) else bytes(data))
    transport.writelines([view[at:at + RECORD_MAX] for at in range(0, len(view), RECORD_MAX)])
