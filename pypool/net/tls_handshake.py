"""The TLS handshakes of a login, with asyncio's SSLProtocol under the same connection.

`accept_client` (after the 'S' answer to a client's SSLRequest) and `connect_server` (after
PostgreSQL's 'S') run `loop.start_tls`: the same connection Protocol keeps getting
`data_received`, now decrypted, from a new transport. `accept_direct` is PostgreSQL 17's
direct TLS, whose ClientHello the client login already read. Each counts its outcome in the
contexts in force (net/tls.py's Tls) and hands it back: to the client's login
(`tls_started`, `tls_failed`), or to the server login's callbacks.

Here, not in net/tls.py, because they take the connections' records (net/records.py), which
name the contexts net/tls.py builds. Never here: when TLS starts (core/client_login.py,
core/server_login.py) or how the contexts are made (net/tls.py).
"""

from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..auth.channel_binding import tls_server_end_point

if TYPE_CHECKING:
    from .records import ClientRecord, ServerRecord
    from .tls import Tls


def accept_direct(client: ClientRecord, tls: Tls, timeout: float,
                  hello: bytes) -> Coroutine[Any, Any, None]:
    """PostgreSQL 17's `sslnegotiation=direct`: the client sent its ClientHello at once, no
    SSLRequest, and `hello` is what of it `data_received` already took. loop.start_tls
    cannot be handed bytes already read, so the TLS layer it would make is made here, the
    same asyncio SSLProtocol, and given them; it takes over the transport now, so that the
    rest of the handshake goes to it. The coroutine returned waits for the handshake."""
    context = tls.client.context
    transport = client.transport
    assert context is not None and transport is not None
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    layer = sslproto.SSLProtocol(loop, client, context, waiter, server_side=True,
                                 call_connection_made=False,
                                 ssl_handshake_timeout=timeout or None)  # type: ignore[arg-type]
    transport.set_protocol(layer)
    layer.connection_made(transport)
    view = memoryview(hello)
    while view:
        buffer = layer.get_buffer(len(view))
        size = min(len(buffer), len(view))
        buffer[:size] = view[:size]
        view = view[size:]
        layer.buffer_updated(size)
    return _direct_handshake(client, tls, waiter, layer)


async def _direct_handshake(client: ClientRecord, tls: Tls, waiter: asyncio.Future[Any],
                            layer: sslproto.SSLProtocol) -> None:
    try:
        await waiter
    except Exception as exc:  # noqa: BLE001 - any failure ends this client's login
        tls.count("client", False)
        if client.login is not None:
            client.login.tls_failed(_reason(exc))
        return
    tls.count("client", True)
    assert client.login is not None  # still logging in: the handshake is part of it
    client.login.tls_started(layer._app_transport, tls.client, direct=True)  # noqa: SLF001


async def accept_client(client: ClientRecord, tls: Tls, timeout: float) -> None:
    """The handshake after the 'S' answer; `client.tls_started` or `client.tls_failed`."""
    context = tls.client.context
    transport = client.transport
    assert context is not None and transport is not None
    loop = asyncio.get_running_loop()
    try:
        new = await loop.start_tls(transport, client, context, server_side=True,
                                   ssl_handshake_timeout=timeout or None)
    except Exception as exc:  # noqa: BLE001 - any failure ends this client's login
        tls.count("client", False)
        if client.login is not None:
            client.login.tls_failed(_reason(exc))
        return
    if new is None:  # the connection went away meanwhile
        tls.count("client", False)
        if client.login is not None:
            client.login.tls_failed("connection closed during the TLS handshake")
        return
    tls.count("client", True)
    assert client.login is not None  # still logging in: the handshake is part of it
    client.login.tls_started(new, tls.client)  # type: ignore[arg-type]  # uvloop's is no subclass


async def connect_server(server: ServerRecord, tls: Tls, host: str, timeout: float,
                         started: Callable[[asyncio.Transport, bytes | None], None],
                         failed: Callable[[str], None]) -> None:
    """The handshake after PostgreSQL's 'S': `started(transport, channel_binding)` or
    `failed(reason)`."""
    context = tls.server.context
    transport = server.transport
    assert context is not None and transport is not None
    loop = asyncio.get_running_loop()
    hostname = host if tls.server.sslmode == "verify-full" else None
    try:
        new = await loop.start_tls(transport, server, context, server_side=False,
                                   server_hostname=hostname,
                                   ssl_handshake_timeout=timeout or None)
    except Exception as exc:  # noqa: BLE001 - any failure is this server's login failing
        tls.count("server", False)
        failed(_reason(exc))
        return
    if new is None:
        tls.count("server", False)
        failed("connection closed during the TLS handshake")
        return
    tls.count("server", True)
    ssl_object = new.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    started(new, tls_server_end_point(der) if der else None)  # type: ignore[arg-type]


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, TimeoutError):
        return "TLS handshake timed out"
    return f"TLS handshake failed: {exc}" if str(exc) else f"TLS handshake failed: {exc!r}"
