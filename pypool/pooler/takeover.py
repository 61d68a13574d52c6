"""Online restart (`pypool -R`): a new process takes over the running one's sockets and its
idle clients, as PgBouncer's takeover does, so an upgrade or a restart drops no connection.

The running pooler listens, besides its unix socket, on `.s.PGSQL.<port>.takeover` in the
same directory (mode 0600; a peer of another OS user is refused, by SO_PEERCRED; see
`takeover_address` for a directory whose path is too long). A new
process started with -R connects there and:

1. asks (its pid); the old one passes its listening sockets (SCM_RIGHTS): TCP, the unix
   socket and the takeover socket itself, and stops accepting on them. The new one accepts
   from now on, on the same sockets: no connection attempt is refused or lost.
2. The old one lets every client finish what it is doing (PgBouncer's SUSPEND): a client
   that is idle, holding no server, with nothing half-read, is paused where it stands (what
   it sends next waits in the kernel for the new process), the others when they get there,
   for at most suspend_timeout.
3. It passes each paused client's socket with what the new process needs to serve it as if
   nothing happened: its user, database, startup and reported parameters, its cancel key,
   its prepared statements and the session settings that follow it, and the SCRAM keys
   its server logins use. The new process opens servers of its own: the old one's close.
   Meanwhile a CancelRequest for a client still in the old process reaches the new one (it
   accepts now): it is passed back on the takeover connection.
4. The old one exits; clients it could not pass (inside a transaction at suspend_timeout,
   TLS, replication, the console) are told `server shutting down` first. TLS connections
   cannot be passed (their keys live in the old process), as with PgBouncer.

The wire between the two is plain: frames of a 4-byte length and a 4-byte count of file
descriptors, sent with the descriptors, then that many bytes of JSON (bytes as base64).
Blocking calls, run in a thread: they carry a few small frames and one per client.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import socket
import struct
import sys
from typing import TYPE_CHECKING, Any, Final

from ..core.states import ClientEvent, ClientState
from ..net.client import ClientConnection
from ..net.unix_socket import MAX_SOCKET_PATH, UnixSocket, peer_uid, socket_path
from ..pooling.params import ClientParams
from ..protocol import errors
from ..protocol.errors import PoolerError
from . import replication
from .takeover_state import Takeover

if TYPE_CHECKING:
    from ..net.records import ClientRecord
    from ..settings import Settings
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool")

_HEADER: Final = struct.Struct("!II")  # JSON length, descriptors sent with the header
_MAX_FRAME: Final = 1 << 28
_MAX_FDS: Final = 64


class TakeoverError(Exception):
    """The takeover cannot go on; the message says why."""


def takeover_address(directory: str, port: int) -> str | bytes:
    """`.s.PGSQL.<port>.takeover` beside the unix socket; where that path is too long for a
    unix socket (the unix socket's own fits, 9 bytes shorter), an abstract socket named
    after it (Linux; the peer's uid is checked all the same)."""
    path = socket_path(directory, port) + ".takeover"
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    own = os.fsencode(os.path.realpath(socket_path(directory, port)))
    return b"\0pypool-takeover-" + hashlib.sha256(own).hexdigest()[:32].encode()


# --- frames --------------------------------------------------------------------------------


def send_frame(sock: socket.socket, body: dict[str, Any], fds: list[int] | None = None) -> None:
    fds = fds or []
    payload = json.dumps(body).encode()
    header = _HEADER.pack(len(payload), len(fds))
    if fds:
        socket.send_fds(sock, [header], fds)
    else:
        sock.sendall(header)
    sock.sendall(payload)


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One frame: its JSON and the descriptors that came with it (the caller owns them)."""
    header, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
    if not header:
        raise TakeoverError("the other process closed the takeover connection")
    if len(header) < _HEADER.size:  # the header is sent on its own: only a short read splits it
        header += _recv_exactly(sock, _HEADER.size - len(header))
    length, count = _HEADER.unpack(header)
    if count != len(fds) or length > _MAX_FRAME:
        for fd in fds:
            os.close(fd)
        raise TakeoverError(f"bad takeover frame ({count} descriptors announced, "
                            f"{len(fds)} came; {length} bytes)")
    return json.loads(_recv_exactly(sock, length)), fds


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    parts = []
    while size:
        part = sock.recv(min(size, 1 << 20))
        if not part:
            raise TakeoverError("the other process closed the takeover connection")
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


# --- the running process: listen, and hand over -------------------------------------------


def listen(pooler: Pooler, sock: socket.socket | None = None) -> None:
    """Serve takeover requests (`sock`: the one a takeover passed on, else a new one)."""
    cfg = pooler.settings.pooler
    if sock is None:
        if not cfg.unix_socket_dir or pooler.worker_count > 1:
            return  # -R needs the unix socket, and one process
        address = takeover_address(cfg.unix_socket_dir, cfg.listen_port)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if isinstance(address, str):
                try:
                    os.unlink(address)  # a crashed process's: the unix socket's lock is ours
                except FileNotFoundError:
                    pass
                sock.bind(address)
                os.chmod(address, 0o600)
            else:
                sock.bind(address)
            sock.listen(4)
        except OSError as exc:
            sock.close()
            log.warning("online restart (-R) unavailable: cannot listen on %r: %s", address,
                        exc)
            return
        sock.setblocking(False)
    pooler.takeover_socket = sock
    pooler.loop.add_reader(sock.fileno(), _accept, pooler, sock)


def close(pooler: Pooler, unlink: bool) -> None:
    """Stop serving takeover requests; `unlink` its path too (at an ordinary exit)."""
    sock = pooler.takeover_socket
    if sock is None:
        return
    pooler.takeover_socket = None
    pooler.loop.remove_reader(sock.fileno())
    address = sock.getsockname()
    if unlink and isinstance(address, str) and address:
        try:
            os.unlink(address)
        except OSError:
            pass
    sock.close()


def _accept(pooler: Pooler, sock: socket.socket) -> None:
    try:
        conn, _ = sock.accept()
    except (BlockingIOError, InterruptedError):
        return
    try:
        uid = peer_uid(conn)
    except OSError:
        uid = -1
    if uid != os.getuid() or pooler.handing_over or pooler.shutting_down:
        log.warning("takeover request refused (%s)",
                    "another OS user" if uid != os.getuid() else "already stopping")
        conn.close()
        return
    pooler.handing_over = True
    pooler.spawn(_hand_over(pooler, conn))


async def _hand_over(pooler: Pooler, conn: socket.socket) -> None:
    conn.setblocking(True)
    conn.settimeout(30)
    fds: list[int] = []
    try:
        request, _ = await asyncio.to_thread(recv_frame, conn)
        pid = int(request.get("pid", 0))
        log.info("takeover: pid %d takes over; passing the listening sockets", pid)
        kinds, fds = _listening_sockets(pooler)
        await asyncio.to_thread(send_frame, conn, {"listeners": kinds}, fds)
        # Both accept on them now; ours close only once the new process says it serves.
        ready, _ = await asyncio.to_thread(recv_frame, conn)
        if not ready.get("ready"):
            raise TakeoverError(f"the new process did not start: {ready.get('error', '?')}")
    except (OSError, TakeoverError, ValueError) as exc:
        log.error("takeover failed, serving on as before: %s", exc)
        conn.close()
        pooler.handing_over = False
        return
    finally:
        for fd in fds:
            os.close(fd)
    _stop_listening(pooler)
    # Cancels for clients still here reach the new process, which accepts now: it passes
    # them back on this connection until the clients are passed.
    pooler.loop.add_reader(conn.fileno(), _passed_back_cancel, pooler, conn)
    for metrics_server in pooler.metrics_servers:
        metrics_server.close()  # for the new process to bind once it has the clients
    pooler.metrics_servers = []
    paused = await _suspend(pooler)
    scram_keys = {user: _b64(key) for user, key in pooler.scram_client_keys.items()}
    frames: list[tuple[dict[str, Any], int]] = []
    for client in paused:
        if client.state is ClientState.IDLE and _passable(client):
            frames.append((describe(client), _detach(pooler, client)))
    for client in list(pooler.clients):
        # Not passed: inside a transaction still, TLS, replication, the console.
        client.fail(errors.shutting_down())
    pooler.loop.remove_reader(conn.fileno())
    try:
        await asyncio.to_thread(_send_clients, conn, scram_keys, frames)
        log.info("takeover: %d clients passed to pid %d; exiting", len(frames), pid)
    except (OSError, TakeoverError) as exc:
        log.error("takeover failed while passing clients: %s", exc)
    finally:
        for _, fd in frames:
            os.close(fd)
        conn.close()
    pooler.exit_now()  # pooler/lifecycle.py


def _passed_back_cancel(pooler: Pooler, conn: socket.socket) -> None:
    """A CancelRequest the new process received for a key this process issued."""
    try:
        body, fds = recv_frame(conn)
    except (OSError, TakeoverError, ValueError):
        pooler.loop.remove_reader(conn.fileno())
        return
    for fd in fds:
        os.close(fd)
    key = body.get("cancel")
    if isinstance(key, list) and len(key) == 2:
        pooler.cancel_here(int(key[0]), int(key[1]))  # pooler/cancel.py


def pass_back_cancel(pooler: Pooler, pid: int, secret: int) -> bool:
    """In the new process while it takes over: a key it does not know may be one of the
    clients still in the old process; send the cancel there. Whether it went."""
    taken = pooler.taken
    if taken is None or not taken.ready:
        return False
    try:
        send_frame(taken.conn, {"cancel": [pid, secret]})
    except OSError:
        return False
    return True


def _listening_sockets(pooler: Pooler) -> tuple[list[str], list[int]]:
    """Duplicates of the listening sockets' descriptors, and what each is."""
    kinds: list[str] = []
    fds: list[int] = []
    for listener in pooler.listeners:
        for sock in getattr(listener, "sockets", ()):  # an asyncio.Server's
            kinds.append("tcp")
            fds.append(os.dup(sock.fileno()))
    if pooler.unix_socket is not None:
        kinds.append("unix")
        fds.append(os.dup(pooler.unix_socket.sock.fileno()))
    if pooler.takeover_socket is not None:
        kinds.append("takeover")
        fds.append(os.dup(pooler.takeover_socket.fileno()))
    return kinds, fds


def _stop_listening(pooler: Pooler) -> None:
    """The new process accepts now: close ours (the sockets live on in its descriptors)."""
    for listener in pooler.listeners:
        listener.close()
    pooler.listeners = []
    if pooler.unix_listener is not None:
        pooler.unix_listener.close()
        pooler.unix_listener = None
    pooler.unix_socket = None  # its files are the new process's now: never removed by us
    close(pooler, unlink=False)


def _passable(client: ClientRecord) -> bool:
    """Whether the client can go to the new process now: logged in, idle, holding no
    server, with nothing read that is not handled yet and nothing written still buffered
    here, no session state busy and no channel listened on."""
    return (
        client.state is ClientState.IDLE
        and client.server is None
        and client.pool is not None
        and client.admin is None
        and not client.tls_info
        and not client.outbox
        and client.reader.idle()
        and not client.reader.drop
        and not client.reader.held
        and client.ledger.idle()
        # Everything written has reached the kernel: nothing of a reply is left behind.
        and not client.writing_paused
        and client.transport is not None
        and client.transport.get_write_buffer_size() == 0
        and (client.session is None or not client.session.busy())
        # Its channels live in this process's listening connection (listen_mode = shared),
        # as a pinned listener's in its server: it stays, as that one does.
        and (client.session is None or not client.session.listening)
        and client.guard is None
    )


def catch(client: ClientRecord) -> None:
    """`client`'s server was just released while this process passes its clients on: pause
    it now, if passable, before it sends its next transaction. A busy client is idle only
    between its ReadyForQuery and its next query; `_suspend`'s poll alone would see it
    there by luck, and tell it `server shutting down` at suspend_timeout."""
    if _passable(client) and client.transport is not None:
        client.transport.pause_reading()


async def _suspend(pooler: Pooler) -> list[ClientRecord]:
    """Pause each client as it becomes passable (at its release: `catch`; the idle ones
    here), until all are (the console's sessions and TLS clients aside) or suspend_timeout
    has passed. The paused, in that order."""
    timeout = pooler.settings.pooler.suspend_timeout or 10.0
    deadline = pooler.now() + timeout
    paused: dict[ClientRecord, None] = {}
    pooler.passing_clients = True
    while True:
        # Servers the old process no longer needs go now: the new one opens its own, and
        # the two together must not hold max_db_connections twice over.
        for pool in list(pooler.pools.values()):
            for server in list(pool.idle):
                pooler.close_server(server, "taken over")
        waiting = 0
        for client in list(pooler.clients):
            if client in paused or client.admin is not None or replication.wants_own_server(
                    client):
                continue  # the console's sessions and replication clients are not passed
            if _passable(client) and client.transport is not None:
                client.transport.pause_reading()
                paused[client] = None
            elif not client.tls_info or client.server is not None:
                waiting += 1
        if not waiting or pooler.now() >= deadline:
            if waiting:
                log.warning("takeover: %d clients still busy after suspend_timeout (%.0f s)",
                            waiting, timeout)
            return [client for client in paused if client.state is not ClientState.CLOSED]
        await asyncio.sleep(0.05)


def describe(client: ClientRecord) -> dict[str, Any]:
    """What the new process needs to serve `client` as it was (see `adopt`)."""
    state: dict[str, Any] = {
        "user": client.user,
        "database": client.database,
        "peer": list(client.peer),
        "startup_params": client.startup_params,
        "params": client.params,
        "cancel_key": list(client.cancel_key),
    }
    statements = client.statements
    if statements is not None:
        state["statements"] = [[_b64(name), _b64(stmt.key)]
                               for name, stmt in statements.names.items()]
        state["sql_statements"] = [[_b64(name), _b64(text)]
                                   for name, text in (statements.sql or {}).items()]
    session = client.session
    if session is not None:
        state["sets"] = [[_b64(name), _b64(statement)]
                         for name, statement in session.sets.items()]
        if session.startup:
            state["startup"] = [[_b64(name), _b64(statement)]
                                for name, statement in session.startup.items()]
    return state


def _detach(pooler: Pooler, client: ClientRecord) -> int:
    """A duplicate of the client's socket, and the client gone from this process without a
    byte or a FIN sent (the connection lives on in the duplicate)."""
    transport = client.transport
    assert transport is not None
    sock = transport.get_extra_info("socket")
    fd = os.dup(sock.fileno())
    pooler.client_closed(client, "taken over")
    transport.abort()
    return fd


def _send_clients(conn: socket.socket, scram_keys: dict[str, str],
                  frames: list[tuple[dict[str, Any], int]]) -> None:
    send_frame(conn, {"scram_keys": scram_keys, "clients": len(frames)})
    for state, fd in frames:
        send_frame(conn, {"client": state}, [fd])
    send_frame(conn, {"done": True})


# --- the new process: ask, take the sockets, adopt the clients ----------------------------


def request(settings: Settings) -> Takeover:
    """Connect to the running pooler and take its listening sockets (before the loop runs;
    blocking). Raises TakeoverError with what to do."""
    cfg = settings.pooler
    if not cfg.unix_socket_dir:
        raise TakeoverError("-R/--reboot needs unix_socket_dir: the takeover goes through "
                            "the unix socket's directory")
    if cfg.workers > 1:
        raise TakeoverError("-R/--reboot takes over one process: not with workers > 1")
    address = takeover_address(cfg.unix_socket_dir, cfg.listen_port)
    path = address if isinstance(address, str) else repr(address)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(30)
    try:
        conn.connect(address)
    except OSError as exc:
        conn.close()
        raise TakeoverError(f"-R/--reboot: no pypool to take over at {path} ({exc}); is one "
                            "running with this unix_socket_dir and listen_port?") from None
    try:
        owner = peer_uid(conn)
        if owner != os.getuid():
            # Whoever answers there would hand us clients to serve unauthenticated.
            raise TakeoverError(f"{path} is served by uid {owner}, not by this OS user")
        send_frame(conn, {"pid": os.getpid()})
        reply, fds = recv_frame(conn)
    except (OSError, TakeoverError) as exc:
        conn.close()
        raise TakeoverError(f"-R/--reboot: cannot take over at {path}: {exc}") from None
    taken = Takeover(conn)
    for kind, fd in zip(reply.get("listeners", []), fds, strict=False):
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        if kind == "tcp":
            taken.tcp.append(sock)
        elif kind == "unix":
            taken.unix = sock
        elif kind == "takeover":
            taken.takeover = sock
        else:
            sock.close()
    return taken


def claim_unix_socket(settings: Settings, sock: socket.socket) -> UnixSocket:
    """The passed unix socket, its lock file rewritten with this process's pid (so that the
    old process, at its exit, leaves both files alone)."""
    cfg = settings.pooler
    path = socket_path(cfg.unix_socket_dir, cfg.listen_port)
    lock_path = path + ".lock"
    with open(lock_path, "w") as lock:
        lock.write(f"{os.getpid()}\n")
    return UnixSocket(path, lock_path, sock, os.getpid())


def _receive_clients(conn: socket.socket) -> tuple[dict[str, str], list[tuple[dict[str, Any],
                                                                              int]]]:
    clients: list[tuple[dict[str, Any], int]] = []
    try:
        head, _ = recv_frame(conn)
        while True:
            body, fds = recv_frame(conn)
            if body.get("done"):
                for fd in fds:
                    os.close(fd)
                return head.get("scram_keys", {}), clients
            if len(fds) != 1 or "client" not in body:
                for fd in fds:
                    os.close(fd)
                continue
            clients.append((body["client"], fds[0]))
    except BaseException:
        for _, fd in clients:  # the old process went away mid-way: none of them is served
            os.close(fd)
        raise


async def finish(pooler: Pooler, taken: Takeover) -> None:
    """Tell the old process this one serves, receive its clients as it passes them, and
    serve them. No second takeover starts meanwhile."""
    pooler.handing_over = True
    taken.conn.settimeout(pooler.settings.pooler.suspend_timeout + 60)
    try:
        await asyncio.to_thread(send_frame, taken.conn, {"ready": True})
        taken.ready = True
        scram_keys, clients = await asyncio.to_thread(_receive_clients, taken.conn)
    except (OSError, TakeoverError, ValueError) as exc:
        log.error("takeover: receiving the clients failed: %s", exc)
        scram_keys, clients = {}, []
    finally:
        pooler.taken = None  # no more cancels go back: the old process has passed its own
        taken.conn.close()
    for user, key in scram_keys.items():
        pooler.scram_client_keys.setdefault(user, _unb64(key))
    adopted = 0
    for state, fd in clients:
        try:
            if await adopt(pooler, state, fd):
                adopted += 1
        except Exception as exc:  # noqa: BLE001 - one client's trouble stops no other's
            log.error("takeover: a client could not be adopted: %s", exc)
    log.info("takeover: %d clients adopted", adopted)
    pooler.handing_over = False
    if pooler.settings.pooler.metrics_port and pooler.serve_metrics is not None:
        cfg = pooler.settings.pooler
        try:
            pooler.metrics_servers = await pooler.serve_metrics(
                cfg.metrics_addr or cfg.listen_addr, cfg.metrics_port)
        except OSError as exc:
            log.error("takeover: metrics endpoint not started: %s", exc)


async def adopt(pooler: Pooler, state: dict[str, Any], fd: int) -> bool:
    """Serve a client the old process passed: logged in, idle, as it was there (no byte
    goes to it; what it sends next is read here). Whether it is served."""
    sock = socket.socket(fileno=fd)
    try:
        sock.setblocking(False)
        client = ClientConnection(pooler)
        # Set up inside connection_made, before the transport reads a byte (uvloop reads
        # at once after it: a pause there is not honoured).
        assert client.login is not None
        client.login.adopting = lambda: _restore(pooler, client, state)
        await pooler.loop.connect_accepted_socket(lambda: client, sock=sock)
    except BaseException:
        sock.close()
        raise
    return client.state is not ClientState.CLOSED  # IDLE, or busy already with what it sent


def _restore(pooler: Pooler, client: ClientRecord, state: dict[str, Any]) -> None:
    """The client's login, as `describe` carried it: from STARTUP to IDLE in one step."""
    try:
        client.user = str(state["user"])
        client.database = str(state["database"])
        client.startup_params = {str(k): str(v) for k, v in state["startup_params"].items()}
        client.params = ClientParams({str(k): str(v) for k, v in state["params"].items()})
        host, port = state["peer"]
        # Its own address, as it was there: a PROXY header's, not the balancer's.
        client.peer = (sys.intern(str(host)), int(port))
        key = (int(state["cancel_key"][0]), int(state["cancel_key"][1]))
        pooler.clients.add(client)
        pooler.client_counts.admit(pooler.settings, client)
        if key in pooler.cancel_keys:
            raise errors.shutting_down()
        pool = pooler.enter_pool(client)  # as at login: its database may be gone now
        client.on(ClientEvent.AUTHENTICATED)
        client.cancel_key = key
        pooler.cancel_keys[key] = client
        client.welcome(pool.server_params or {}, send=False)
        statements = client.statements
        if statements is not None:
            for name, body in state.get("statements", []):
                statements.names[_unb64(name)] = statements.registry.acquire(_unb64(body))
            for name, text in state.get("sql_statements", []):
                statements.add_sql(_unb64(name), _unb64(text))
        sets = state.get("sets", [])
        session = client.session_record() if sets else None
        if session is not None:
            for name, statement in sets:
                session.sets[_unb64(name)] = _unb64(statement)
            startup = state.get("startup", [])
            if startup:
                session.startup = {_unb64(name): _unb64(statement) for name, statement in startup}
    except PoolerError as exc:
        client.fail(exc)
    except (KeyError, ValueError, TypeError, IndexError) as bad:
        log.error("takeover: %r: bad client state: %s", client, bad)
        client.fail(errors.shutting_down())
