"""The floor: a no-op relay on uvloop, measured beside pypool and PgBouncer (`bench/run
--poolers pypool,pgbouncer,relay`).

Each client connection gets one PostgreSQL connection of its own (1:1, no pool, no parsing):
bytes in, `transport.write` out, with flow control both ways (a side whose socket buffer
fills stops the other side's reads). The client logs in to PostgreSQL itself, through it.
Whatever a Python pooler on uvloop does beyond this costs CPU per transaction that this
does not: pypool's pooler CPU divided by this one's is what its own work costs.

Run as a target: `python bench/relay.py INI`, the ini the harness writes for the poolers
(its listen_addr and listen_port, and the host and port of its first [databases] entry).
"""

from __future__ import annotations

import asyncio
import configparser
import sys

import uvloop


class Side(asyncio.Protocol):
    """One end of a relayed connection; `other` is the far end."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: Side | None = None
        self.early: list[bytes] = []  # what the client sent before PostgreSQL answered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        other = self.other
        if other is not None and other.transport is not None:
            other.transport.write(data)
        else:
            self.early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()


class Client(Side):
    """A client's end: on connect, open its PostgreSQL connection and join the two."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self.host, self.port = host, port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        server = Side()
        try:
            await asyncio.get_running_loop().create_connection(lambda: server, self.host,
                                                               self.port)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        server.other, self.other = self, server
        if server.transport is not None and self.early:
            server.transport.write(b"".join(self.early))
            self.early.clear()


def read_ini(ini: str) -> tuple[configparser.SectionProxy, tuple[str, int], dict[str, str]]:
    """What the harness's ini (bench/poolers.py) tells a bench target: its [pgbouncer]
    section, the address to listen on, and the first [databases] entry's fields (host, port,
    dbname: the entry's name when the fields do not say)."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.read(ini)
    section = parser["pgbouncer"]
    listen = (section.get("listen_addr", "127.0.0.1"), int(section["listen_port"]))
    name, entry = next(iter(parser["databases"].items()))
    fields = {"host": "127.0.0.1", "port": "5432", "dbname": name,
              **dict(part.split("=", 1) for part in entry.split())}
    return section, listen, fields


async def serve(ini: str) -> None:
    _, listen, fields = read_ini(ini)
    host, port = fields["host"], int(fields["port"])
    server = await asyncio.get_running_loop().create_server(
        lambda: Client(host, port), *listen, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(sys.argv[1]))
