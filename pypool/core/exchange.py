"""How a login exchange is run: a generator that is sent bytes and yields bytes.

Theory of operation (psycopg 3's `psycopg/generators.py` is the model). A multi-step
exchange, the client's login (core/client_login.py) or the pooler's login into PostgreSQL
(core/server_login.py), is written top to bottom as one generator, which keeps its place
between steps itself, with no flags:

- each value it yields is what to send to the peer now; b"" means it needs more bytes;
- each value it is sent is more bytes from the peer (b"" for none, after it yielded some,
  so that it can go on with messages it already holds);
- it returns its result when the exchange is over, or raises the error to report.

`advance` is all the asyncio adapters in net/ do with one: no socket, no loop here, so the
tests (tests/core/) run the same exchanges by feeding bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TypeVar, cast

T = TypeVar("T")


def advance(
    step: Generator[bytes, bytes, T], data: bytes, write: Callable[[bytes], None]
) -> T | None:
    """Give `step` the bytes that arrived and `write` each reply it yields; its result if
    that ended the exchange, None while it waits for more. Its errors propagate."""
    try:
        out = step.send(data)
        while out:
            write(out)
            out = step.send(b"")
    except StopIteration as done:
        return cast(T, done.value)
    return None
