"""Message framing: split a byte stream into (type, body) messages.

`MessageBuffer` is the careful, whole-message splitter used during login and on the slow
paths, where every message is read. The hot path (see `net/`) walks 5-byte headers only
and forwards bodies untouched, with `header_at`.

Every message after the startup packet is a type byte, an Int32 length that counts itself
but not the type byte, and a body. A length below 4 or above the configured maximum is a
protocol violation by the sender.
"""

from __future__ import annotations

from collections.abc import Iterator

from mypy_extensions import i64

HEADER_SIZE = 5


class FramingError(Exception):
    """The peer sent a length that cannot be a message."""


class MessageTooLarge(FramingError):
    """A message longer than the buffer's `max_size`, found from its header alone."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"message of {size} bytes exceeds max_packet_size")
        self.size = size
        self.limit = limit


def be32(data: bytes, pos: i64) -> i64:
    """The unsigned big-endian Int32 at data[pos:pos + 4]: a message's length field. Read
    byte by byte, which compiled code does without making a slice or calling
    int.from_bytes (every message header on the hot path). In 64-bit machine integers
    (mypy_extensions' i64, a plain int when not compiled): with Python's ints each shift
    and each `|` was a call that guards against overflow (bench/README.md)."""
    return ((i64(data[pos]) << 24) | (i64(data[pos + 1]) << 16) | (i64(data[pos + 2]) << 8)
            | i64(data[pos + 3]))


def header_at(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Type byte and total size (header included) of the message starting at `pos`."""
    length = int.from_bytes(data[pos + 1 : pos + 5], "big")
    if length < 4:
        raise FramingError(f"invalid message length {length}")
    return data[pos], length + 1


class MessageBuffer:
    """Accumulates bytes and yields whole messages as (type, body) pairs.

    `max_size` bounds one message (PgBouncer's max_packet_size); a larger one raises
    FramingError before its body is buffered.
    """

    __slots__ = ("_buffer", "max_size")

    def __init__(self, max_size: int = 2147483647) -> None:
        self._buffer = bytearray()
        self.max_size = max_size

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    def __len__(self) -> int:
        return len(self._buffer)

    def next_type(self) -> int:
        """The type byte of the next message, once its first byte is here; -1 before."""
        return self._buffer[0] if self._buffer else -1

    def take_rest(self) -> bytes:
        """Everything not yet consumed, leaving the buffer empty."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    def messages(self) -> Iterator[tuple[int, bytes]]:
        # Each message leaves the buffer before it is yielded, so a consumer that stops
        # half-way (a login that ends) can take_rest() without getting consumed bytes again.
        # Deleting from the front of a bytearray is amortised O(1) in CPython.
        buf = self._buffer
        while len(buf) >= HEADER_SIZE:
            kind, size = header_at(buf, 0)
            if size > self.max_size:
                raise MessageTooLarge(size, self.max_size)
            if len(buf) < size:
                break
            body = bytes(buf[HEADER_SIZE:size])
            del buf[:size]
            yield kind, body
