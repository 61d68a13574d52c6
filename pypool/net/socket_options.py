"""The [pgbouncer] tcp_* keys, applied to each TCP socket the pooler opens, and to its
listening sockets, whose options each accepted client socket inherits (tune_listeners).

tcp_keepalive (with tcp_keepcnt, tcp_keepidle, tcp_keepintvl), tcp_user_timeout (in
milliseconds) and tcp_socket_buffer (send and receive buffers), as PgBouncer's tune_socket
sets them; 0 leaves the kernel's default. An option the platform lacks is skipped, and a
failing setsockopt never fails the connection.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ..settings import PoolerSettings



def tune_tcp(sock: Any, cfg: PoolerSettings) -> None:
    """Set the tcp_* options on `sock`, a connected TCP socket. TCP_NODELAY is the event
    loop's: uvloop's and asyncio's TCP transports both set it on every connection."""
    _set_options(sock, _options_for(cfg))


def _set_options(sock: Any, options: Iterable[tuple[int, int, int]]) -> None:
    # uvloop's socket stand-in makes a socket object (and a getsockname) per setsockopt:
    # one real object for them all, detached so that it never closes the descriptor.
    real = socket.socket(sock.family, sock.type, sock.proto, sock.fileno())
    try:
        for level, option, value in options:
            try:
                real.setsockopt(level, option, value)
            except OSError:
                pass
    finally:
        real.detach()


def tune_listeners(listeners: Iterable[Any], cfg: PoolerSettings) -> None:
    """Set the tcp_* options on the listening TCP sockets of `listeners` (asyncio Servers).
    Linux gives every accepted socket its listener's options (SO_KEEPALIVE, the TCP_KEEP*
    values, TCP_USER_TIMEOUT, the buffer sizes), so a client login makes no setsockopt call
    and no socket object for it, where PgBouncer's tune_socket sets them per connection. A
    reload re-tunes the listeners for the clients accepted after it; so that a key set back
    to 0 means the kernel's default again, every keepalive value is set, 0 as the kernel's
    own (net.ipv4.tcp_keepalive_*). Only buffer sizes cannot go back: a socket whose size
    was set is no longer autotuned, so tcp_socket_buffer back to 0 waits for a restart
    (lifecycle.apply_settings says so)."""
    options = list(_options_for(cfg))
    if cfg.tcp_keepalive:
        given = {option for _, option, _ in options}
        for name, default in _KERNEL_KEEPALIVE:
            option = getattr(socket, name, None)
            if option is not None and option not in given and default:
                options.append((socket.IPPROTO_TCP, option, default))
    if not cfg.tcp_user_timeout and hasattr(socket, "TCP_USER_TIMEOUT"):
        options.append((socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 0))
    for listener in listeners:
        for sock in listener.sockets or ():
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            _set_options(sock, options)


def _kernel_keepalive() -> tuple[tuple[str, int], ...]:
    """The kernel's keepalive defaults, as the TCP_KEEP* options name them (0: unknown)."""
    found = []
    for name, knob in (("TCP_KEEPIDLE", "tcp_keepalive_time"),
                       ("TCP_KEEPINTVL", "tcp_keepalive_intvl"),
                       ("TCP_KEEPCNT", "tcp_keepalive_probes")):
        try:
            with open(f"/proc/sys/net/ipv4/{knob}") as f:
                found.append((name, int(f.read().strip())))
        except (OSError, ValueError):
            found.append((name, 0))
    return tuple(found)


_KERNEL_KEEPALIVE: Final = _kernel_keepalive()


# The options of the settings last asked for: a reload makes a new PoolerSettings, so the
# cache is keyed by that object, and every login until the next reload reuses its list.
_cached: tuple[object, tuple[tuple[int, int, int], ...]] = (None, ())


def _options_for(cfg: PoolerSettings) -> tuple[tuple[int, int, int], ...]:
    global _cached
    if _cached[0] is cfg:
        return _cached[1]
    options: list[tuple[int, int, int]] = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, int(cfg.tcp_keepalive))]
    if cfg.tcp_keepalive:
        for name, value in (("TCP_KEEPCNT", cfg.tcp_keepcnt), ("TCP_KEEPIDLE", cfg.tcp_keepidle),
                            ("TCP_KEEPINTVL", cfg.tcp_keepintvl)):
            if value and hasattr(socket, name):
                options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    if cfg.tcp_user_timeout and hasattr(socket, "TCP_USER_TIMEOUT"):
        options.append((socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, cfg.tcp_user_timeout))
    if cfg.tcp_socket_buffer:
        options.append((socket.SOL_SOCKET, socket.SO_SNDBUF, cfg.tcp_socket_buffer))
        options.append((socket.SOL_SOCKET, socket.SO_RCVBUF, cfg.tcp_socket_buffer))
    _cached = (cfg, tuple(options))
    return _cached[1]


# The least send and receive buffer of a replication connection's two sockets (below).
STREAM_BUFFER_FLOOR = 256 * 1024


def widen_for_streaming(sock: Any, cfg: PoolerSettings) -> None:
    """A replication stream through the pooler (net/replication_pipe.py) is one bulk
    transfer: with tcp_socket_buffer set below STREAM_BUFFER_FLOOR its buffers are raised to
    it. Through buffers of a few KiB one segment at a time is in flight, the peer delays its
    ACK for a second one that cannot come, and pg_basebackup crawls at 8 KiB per delayed
    ACK. 0 (the kernel's autotuned default) is left alone."""
    size = cfg.tcp_socket_buffer
    if not size or size >= STREAM_BUFFER_FLOOR or sock is None:
        return
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, STREAM_BUFFER_FLOOR)
        except OSError:
            pass
