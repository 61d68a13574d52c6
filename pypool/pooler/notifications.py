"""LISTEN/NOTIFY without pinning (listen_mode = shared): keeping each pool's listening
connection, and handing what it hears to the clients that listen.

The channels and who wants them are the pool's `Listening` (pooling/listening.py); the
connection is net/listen_server.py. This module is the glue between them and the clients:

- a client's LISTEN, UNLISTEN, UNLISTEN * and DISCARD ALL are seen as they are sent
  (`changed`, from pooler/transactions.py: the listening connection is asked for a new
  channel at once) and take effect when their transaction commits (`ready`, at the
  ReadyForQuery 'I' that ends it), as PostgreSQL makes them; the client leaving (`gone`)
  wants nothing. The listening connection is opened when a pool's first channel is wanted
  and closed when none is;
- each notification heard goes to every client that listens on its channel (`_heard`):
  written at once when the client is receiving nothing (no server, or its server owes it
  nothing and stands at a message boundary: net/server.py `at_message_boundary`), else
  held in its session record and written after its next ReadyForQuery, never inside
  another message. Order is kept per client, so per channel;
- the bridge: a LISTEN commits on the client's own server, which listens from then on; the
  listening connection's LISTEN, sent when the client's went by, may not have committed
  yet (always so for a pool's first LISTEN, whose connection is still logging in). Then
  the client keeps that server (`bridged`: a `listen` pin, without the NOTICE) and hears
  those channels from it, as with listen_mode = pin, until the listening connection has
  them: the server goes back at
  once if the client is idle, else at its next ReadyForQuery, and gets UNLISTEN * before
  its next client. Nothing committed after the client's LISTEN is missed but what commits
  in the instant between that server's last ReadyForQuery and the pooler reading it. (Not
  bridged, that server may still deliver with the LISTEN's ReadyForQuery what PostgreSQL
  gives a new listener at its commit, which the listening connection may then deliver
  again: a duplicate, never a loss);
- when the connection is lost, every client that listened gets a NOTICE saying
  notifications may have been missed, a new connection is opened (at once if the lost one
  had logged in, else after server_login_retry), LISTENs every channel again, and once it
  holds them all the clients get a second NOTICE saying so.

Costs nothing to a pool where nobody listens: one attribute test per ReadyForQuery of a
client with a session record (transactions.py).
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import TYPE_CHECKING

from ..core import link, server_login
from ..core.link import LinkEvent, LinkState
from ..core.server_login import LoggedIn
from ..core.states import ClientState
from ..net.listen_server import ListenServer
from ..pooling import session_state as ss
from ..pooling.listening import Listening
from ..protocol import messages as m
from . import linking, server_logins

if TYPE_CHECKING:
    from ..net.records import ClientRecord
    from ..pooling.pool import Pool
    from ..pooling.session_state import ClientSession
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool.listen")

# The application_name of a listening connection (unless its database entry sets one), so
# pg_stat_activity tells it from the pool's servers.
APPLICATION_NAME = "pypool listener"
LOST_NOTICE = ("pypool: the connection that listens for this pool was lost ({reason}); "
               "notifications sent until it is back may be missed")
BACK_NOTICE = ("pypool: listening again for this pool; notifications sent while the "
               "connection was down were missed")


def shared(pooler: Pooler) -> bool:
    return pooler.settings.pooler.listen_mode == "shared"


def changed(pooler: Pooler, client: ClientRecord, session: ClientSession) -> None:
    """What `client` wants may have changed (a LISTEN or UNLISTEN sent, or its transaction
    ended): tell its pool's Listening, and open or ask its listening connection."""
    pool = client.pool
    assert pool is not None
    committed, pending = session.channels()
    wanted = committed | pending
    hub = pool.listening
    if hub is None:
        if not wanted:
            return
        hub = pool.listening = Listening()
    hub.want(client, wanted)
    _keep(pooler, pool, hub)


def ready(pooler: Pooler, client: ClientRecord, session: ClientSession) -> None:
    """After a ReadyForQuery that leaves `client` owed nothing: its LISTENs and UNLISTENs
    may have committed; its server may be kept as a bridge (a `listen` pin, see the module
    docstring); write what was held for it (a message boundary)."""
    changed(pooler, client, session)
    committed = frozenset(session.listening)
    new = committed - session.heard
    session.heard = committed
    hub = client.pool.listening if client.pool is not None else None
    if client.tx_status == m.TX_IDLE and hub is not None:
        bridged = frozenset(c for c in (session.bridged | new) & committed
                            if c not in hub.listened)
        if bridged and not session.bridged:
            hub.bridging[client] = None
        elif session.bridged and not bridged:
            hub.bridging.pop(client, None)
        session.bridged = bridged
        # The bridge is a pin while it lasts (SHOW CLIENTS says `listen`; no pipeline line
        # forms behind it, net/pipeline.py), though no NOTICE says so (transactions.py).
        if bridged:
            session.pins[ss.LISTEN] = 1
        else:
            session.pins.pop(ss.LISTEN, None)
    if session.held:
        _flush(client, session)


def gone(pooler: Pooler, client: ClientRecord) -> None:
    """`client` left: it wants nothing any more."""
    pool = client.pool
    hub = pool.listening if pool is not None else None
    if pool is not None and hub is not None:
        hub.bridging.pop(client, None)
        if client in hub.wants:
            hub.want(client, frozenset())
            _keep(pooler, pool, hub)


def _flush(client: ClientRecord, session: ClientSession) -> None:
    """Write the held notifications of the channels it still listens on (UNLISTENed since:
    dropped), and the pooler's NOTICEs (channel b"")."""
    listening = session.listening
    out = [message for channel, message in session.held if not channel or channel in listening]
    session.held = []
    if out:
        _write(client, out)


def _write(client: ClientRecord, messages: list[bytes]) -> None:
    client.write(b"".join(messages))
    assert client.pool is not None
    client.pool.stats.notifications_delivered += sum(
        1 for message in messages if message[0] == m.NOTIFICATION_RESPONSE)


def _receiving(client: ClientRecord) -> bool:
    """Whether something the server sends is on its way to `client` now (or may be, with
    replies owed): then a notification waits for the next ReadyForQuery."""
    server = client.server
    if server is None or server.client is not client:
        return False  # no server, or queued behind another client's transaction
    return not (client.ledger.idle() and server.at_message_boundary())


def _hand(client: ClientRecord, channel: bytes, message: bytes) -> None:
    """Give `client` one notification (or the pooler's NOTICE, channel b"") now if it may
    take it, else hold it."""
    session = client.session
    if session is None or client.state is ClientState.CLOSED:
        return
    if channel and (channel not in session.listening or channel in session.bridged):
        return  # its LISTEN not committed (it takes effect then), or its server hears it
    if session.held or _receiving(client):
        session.held.append((channel, message))
    else:
        _write(client, [message])


def _heard(pooler: Pooler, hub: Listening, found: list[tuple[bytes, bytes]]) -> None:
    """What the listening connection read: its notifications, and maybe channels it now
    holds, which ends the bridge of idle clients."""
    for channel, message in found:
        for client in hub.receivers(channel):
            _hand(client, channel, message)  # type: ignore[arg-type]
    if hub.bridging:
        for client in list(hub.bridging):
            _end_bridge(pooler, hub, client)  # type: ignore[arg-type]
    if hub.told and hub.connected and all(channel in hub.listened for channel in hub.wanted):
        _back(hub)


def _end_bridge(pooler: Pooler, hub: Listening, client: ClientRecord) -> None:
    """A bridged client whose channels the listening connection now holds gives its
    server back if it is idle (else its next ReadyForQuery does)."""
    session = client.session
    if session is None or client.state is ClientState.CLOSED:
        hub.bridging.pop(client, None)
        return
    if any(channel not in hub.listened for channel in session.bridged):
        return
    server = client.server
    if (server is None or server.client is not client or server.chain
            or any(kind != ss.LISTEN for kind in session.pins)  # pinned for more
            or client.tx_status != m.TX_IDLE or _receiving(client)
            or client.link.state is not LinkState.ACTIVE):
        return
    session.bridged = frozenset()
    session.pins.pop(ss.LISTEN, None)
    hub.bridging.pop(client, None)
    # The link's own release (core/link.py), as at the ReadyForQuery it kept the server at.
    last = client.link.last  # SIGINT's shutdown marked it: it ends with this release
    actions = client.on_link(LinkEvent.READY_RELEASE_LAST if last else LinkEvent.READY_RELEASE)
    if actions & link.RELEASE:
        assert client.pool is not None
        client.pool.stats.xact_count -= 1  # release() counts one; no transaction ended here
        linking.release(pooler, client, then_close=bool(actions & link.CLOSE_CLIENT))


# --- the listening connection ------------------------------------------------------------


def _keep(pooler: Pooler, pool: Pool, hub: Listening) -> None:
    """Open the connection when channels are wanted and none is there, close it when none
    is wanted, or ask it for what changed."""
    connection: ListenServer | None = hub.connection  # type: ignore[assignment]
    if not hub.wanted:
        if connection is not None:
            connection.close("nobody listens")  # _lost forgets it
        return
    if connection is not None:
        connection.ask()
    elif not hub.retry_at or pooler.now() >= hub.retry_at:
        _open(pooler, pool, hub)
    elif not hub.retry_scheduled:
        hub.retry_scheduled = True
        pooler.loop.call_later(hub.retry_at - pooler.now(), _retry, pooler, pool, hub)


def _retry(pooler: Pooler, pool: Pool, hub: Listening) -> None:
    hub.retry_scheduled = False
    if pool.listening is hub and hub.connection is None and hub.wanted:
        _open(pooler, pool, hub)


def _open(pooler: Pooler, pool: Pool, hub: Listening) -> None:
    entry = pooler.settings.database(pool.database)
    if entry is None:
        return
    creds = pooler.credentials_for(entry, pool.user)
    startup = server_logins.entry_startup(pooler, entry)
    startup.setdefault("application_name", APPLICATION_NAME)
    verifier = creds.verifier

    def login() -> Generator[bytes, bytes, LoggedIn]:
        return server_login.login(
            creds.user, entry.server_dbname, startup, password=creds.password,
            md5_hash=creds.md5_hash, client_key=creds.scram_client_key,
            server_key=verifier.server_key if verifier is not None else None)

    host = pooler.hosts.pick(entry)
    context = pooler.tls.server.context
    tls = (context, pooler.tls.server.sslmode, host) if context is not None else None
    name = f"{pool.database}/{pool.user}"
    connection = ListenServer(
        hub, name, login, tls,
        lambda found: _heard(pooler, hub, found),
        lambda reason: _lost(pooler, pool, hub, connection, reason),
        lambda: _up(pool, hub))
    hub.connection = connection
    pooler.spawn(connection.connect(pooler.loop, host, entry.port,
                                    pooler.settings.pooler.server_connect_timeout))


def _up(pool: Pool, hub: Listening) -> None:
    """Logged in: a failure from now on is retried at once."""
    hub.retry_at = 0.0


def _back(hub: Listening) -> None:
    """After a loss, once every channel is listened to again: the clients that were told
    are told it is back (from then on nothing is missed)."""
    told, hub.told = hub.told, []
    for client in told:
        if client in hub.wants:
            _hand(client, b"", m.notice_response(BACK_NOTICE))  # type: ignore[arg-type]


def _lost(pooler: Pooler, pool: Pool, hub: Listening, connection: ListenServer,
          reason: str) -> None:
    """The listening connection is gone (or never came up)."""
    if hub.connection is not connection:
        return  # an older one's late word
    hub.connection = None
    was_up = hub.connected
    clients = hub.lost()
    if not hub.wanted:
        return  # closed because nobody listens
    log.warning("%s/%s: listening connection lost: %s", pool.database, pool.user, reason)
    if was_up:
        notice = m.notice_response(LOST_NOTICE.format(reason=reason))
        for client in clients:
            _hand(client, b"", notice)  # type: ignore[arg-type]
        hub.told = clients
        hub.retry_at = 0.0  # it was up: try again at once
    else:
        hub.retry_at = pooler.now() + pooler.settings.pooler.server_login_retry
    _keep(pooler, pool, hub)
