"""Peers: a CancelRequest that reached the wrong pooler goes on to the one that owns its key.

Several poolers behind one TCP load balancer (or sharing a port through so_reuseport) each
hand out their own cancel keys, but a client's CancelRequest arrives on a new connection,
which the balancer may send to any of them. PgBouncer 1.19+ solves this with `peer_id` and
`[peers]`; pypool does the same, byte for byte, so pypool and PgBouncer instances can be
peers of each other:

- with `peer_id` > 0, every key handed out carries it (protocol/cancel_key.py);
- a CancelRequest whose key names another peer_id is sent, on a new connection, to that
  peer's `[peers]` address (a unix socket directory or a host), with its TTL one lower; the
  peer, seeing its own id, cancels the query. An unknown peer_id, or a TTL worn down to 0
  (peers that name each other wrongly), drops the request, as PgBouncer does;
- at most the peer's `pool_size` (else default_pool_size) cancels are in flight to it at
  once; more wait their turn (pooling/peer_pool.py, SHOW PEER_POOLS);
- with the PROXY protocol on (`proxy_protocol_sources`), peers share their ini: where the
  address a forwarded cancel leaves from is one of the sources, the peer requires a header
  on it, so the cancel opens with a v2 LOCAL header (the sender speaking for itself, naming
  nobody); from any other address it sends none, as the peer then refuses one.

`workers` = N uses the same routing inside one instance: each worker writes its number into
its keys (byte 3) and listens on a private socket of its own (Linux's abstract namespace,
named after the parent's pid), and a worker that receives a sibling's key passes it on
there. The sibling cancels locally and never forwards again, so there is no loop. (An
abstract socket has no file mode: any local process may connect, as to the listen port,
and needs the key's secret all the same.)

What this must never do: cancel a query of a client the key does not belong to. It only
carries the key; the owner checks it as for any CancelRequest (cancel.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING

from ..core.client_login import trusted_proxy
from ..pooling.peer_pool import PeerPool
from ..protocol import cancel_key
from ..protocol import messages as m
from ..protocol.proxy_header import proxy_v2
from ..protocol.startup import CANCEL_REQUEST_CODE

if TYPE_CHECKING:
    from ..settings import PeerEntry
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool")


def route(pooler: Pooler, pid: int, secret: int) -> tuple[int, int] | None:
    """The key to look up in this process, or None when it belongs to another peer or
    worker (then it has been sent on there, or dropped)."""
    own = pooler.settings.pooler.peer_id
    if own > 0:
        owner = cancel_key.peer_of(pid)
        if owner != own:
            to_peer(pooler, owner, pid, secret)
            return None
        secret = cancel_key.as_issued(secret)
    worker = pooler.worker_index
    if worker != cancel_key.NO_WORKER and cancel_key.worker_of(pid) != worker:
        to_worker(pooler, cancel_key.worker_of(pid), pid, secret)
        return None
    return pid, secret


# --- [peers] ------------------------------------------------------------------------------


def to_peer(pooler: Pooler, peer_id: int, pid: int, secret: int) -> None:
    if cancel_key.ttl(secret) == 0:
        log.info("failed to forward cancel request because its TTL was exhausted")
        return
    peer = pooler.settings.peers.get(peer_id)
    if peer is None:
        log.info("could not find peer %d to forward cancel request to", peer_id)
        return
    pool = pooler.peer_pools.get(peer_id)
    if pool is None:
        pool = pooler.peer_pools[peer_id] = PeerPool(peer_id)
    key = (pid, cancel_key.forwarded(secret))
    if not pool.take_slot(_pool_size(pooler, peer)):
        pool.waiting.append(key)
        return
    pooler.spawn(_send_to_peer(pooler, pool, key))


def _pool_size(pooler: Pooler, peer: PeerEntry) -> int:
    return peer.pool_size if peer.pool_size >= 0 else pooler.settings.pooler.default_pool_size


async def _send_to_peer(pooler: Pooler, pool: PeerPool, key: tuple[int, int] | None) -> None:
    """Send `key`, then every key that queued behind it, one connection each."""
    while key is not None:
        peer = pooler.settings.peers.get(pool.peer_id)  # a reload may have moved or removed it
        sent = False
        if peer is not None:
            log.debug("forwarding cancel request to peer %d", pool.peer_id)
            sent = await _send(pooler, peer.host, peer.port, key, pool)
        key = pool.done(sent)
    if pool.idle and pool.peer_id not in pooler.settings.peers:
        pooler.peer_pools.pop(pool.peer_id, None)


async def _send(pooler: Pooler, host: str, port: int, key: tuple[int, int],
                pool: PeerPool) -> bool:
    """One CancelRequest on a connection of its own; whether it was sent (the peer closing
    the connection afterwards is all the answer there is)."""
    sent = False
    try:
        async with asyncio.timeout(pooler.settings.pooler.cancel_wait_timeout or None):
            if host.startswith("/"):  # a unix socket directory, as libpq's host=
                reader, writer = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
            else:
                reader, writer = await asyncio.open_connection(host, port)
            try:
                if _header_expected(pooler, writer):
                    writer.write(proxy_v2(None))
                writer.write(m.cancel_request(*key))
                await writer.drain()
                pool.sent()
                sent = True
                await reader.read()
            finally:
                writer.close()
    except (OSError, TimeoutError) as failure:
        log.warning("cancel request to peer %d at %s:%d failed: %s", pool.peer_id, host, port,
                    "cancel_wait_timeout" if isinstance(failure, TimeoutError) else failure)
    return sent


def _header_expected(pooler: Pooler, writer: asyncio.StreamWriter) -> bool:
    """Whether the peer will require a PROXY header on this connection: its address (ours,
    as the peer sees it) is one of proxy_protocol_sources, which peers share."""
    sources = pooler.settings.pooler.proxy_protocol_sources
    sockname = writer.get_extra_info("sockname")
    return (bool(sources) and isinstance(sockname, tuple)
            and trusted_proxy(str(sockname[0]), sources))


# --- workers ------------------------------------------------------------------------------


def worker_address(parent_pid: int, worker: int) -> str:
    """The abstract unix socket a worker takes sibling cancels on (nothing on disk)."""
    return f"\0pypool.{parent_pid}.cancel.{worker}"


async def listen_for_siblings(pooler: Pooler) -> asyncio.AbstractServer:
    """This worker's private socket: each connection carries one CancelRequest from a
    sibling, for a key this worker issued. It is cancelled here, never forwarded."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(worker_address(pooler.worker_parent, pooler.worker_index))
    sock.listen(64)
    sock.setblocking(False)

    async def take(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            packet = await asyncio.wait_for(reader.readexactly(16), 5)
            size, code, pid, secret = (int.from_bytes(packet[i:i + 4], "big")
                                       for i in (0, 4, 8, 12))
            if size == 16 and code == CANCEL_REQUEST_CODE:
                pooler.cancel_here(pid, secret)  # pooler/cancel.py
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    return await asyncio.start_unix_server(take, sock=sock)


def to_worker(pooler: Pooler, worker: int, pid: int, secret: int) -> None:
    if not 0 <= worker < pooler.worker_count:
        return  # not a key any worker of ours issued
    pooler.spawn(_send_to_worker(pooler, worker, (pid, secret)))


async def _send_to_worker(pooler: Pooler, worker: int, key: tuple[int, int]) -> None:
    try:
        async with asyncio.timeout(pooler.settings.pooler.cancel_wait_timeout or None):
            # uvloop refuses abstract names in its connect. A unix connect completes at
            # once or fails (EAGAIN: the sibling's backlog is full), it never waits.
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(worker_address(pooler.worker_parent, worker))
            except OSError:
                sock.close()
                raise
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            try:
                if _header_expected(pooler, writer):
                    writer.write(proxy_v2(None))
                writer.write(m.cancel_request(*key))
                await writer.drain()
                await reader.read()
            finally:
                writer.close()
    except (OSError, TimeoutError) as failure:
        log.warning("cancel request to worker %d failed: %s", worker + 1, failure)
