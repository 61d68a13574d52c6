"""Copying one side of a test's TCP proxy to the other (the proxies in front of PostgreSQL
in test_guarantees.py and test_server_starting_up.py)."""

from __future__ import annotations

import asyncio


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy until `src` ends or either side fails, then close `dst` (so a side that closes
    closes the other one too)."""
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        dst.close()
