"""The tcp_* keys reach each accepted client socket through its listener (tune_listeners):
checked on the accepted socket itself, on a real uvloop server, before and after a re-tune
(what a reload does)."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvloop

from pypool.net.socket_options import tune_listeners
from pypool.settings import PoolerSettings

pytestmark = pytest.mark.timeout(20)

KEYS = (
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
    (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
    (socket.IPPROTO_TCP, socket.TCP_NODELAY),
)


async def _accepted_options(cfgs: list[PoolerSettings]) -> list[tuple[int, ...]]:
    """Tune a listener with each of `cfgs` in turn, and after each read the options of a
    socket it accepts."""
    seen: asyncio.Queue[tuple[int, ...]] = asyncio.Queue()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            seen.put_nowait(tuple(sock.getsockopt(level, name) for level, name in KEYS))

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Probe, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    found = []
    try:
        for cfg in cfgs:
            tune_listeners([server], cfg)
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            found.append(await asyncio.wait_for(seen.get(), 5))
            writer.close()
    finally:
        server.close()
    return found


def test_accepted_sockets_take_the_listeners_tcp_options() -> None:
    first = PoolerSettings(tcp_keepalive=True, tcp_keepidle=77, tcp_keepintvl=11,
                           tcp_keepcnt=5, tcp_user_timeout=1234)
    reloaded = PoolerSettings(tcp_keepalive=True, tcp_keepidle=88, tcp_keepintvl=22,
                              tcp_keepcnt=3, tcp_user_timeout=0)
    defaults = PoolerSettings(tcp_keepalive=True, tcp_keepidle=0, tcp_keepintvl=0,
                              tcp_keepcnt=0)
    off = PoolerSettings(tcp_keepalive=False)
    found = uvloop.run(_accepted_options([first, reloaded, defaults, off]))
    assert found[0] == (1, 77, 11, 5, 1234, 1)
    assert found[1] == (1, 88, 22, 3, 0, 1)  # a reload's values, for the next client
    # Back to 0: the kernel's own defaults again, not the values set before.
    kernel = tuple(int(open(f"/proc/sys/net/ipv4/tcp_keepalive_{knob}").read())
                   for knob in ("time", "intvl", "probes"))
    assert found[2] == (1, *kernel, 0, 1)
    assert found[3][0] == 0  # tcp_keepalive = 0 turns it off again
    assert found[3][5] == 1  # TCP_NODELAY: the event loop's, always on
