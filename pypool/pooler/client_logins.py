"""Client logins: whether a client may log in, the secret it is checked against, and
what follows its authentication.

`begin_authentication` runs when a client's startup packet is in: it refuses a client
during a shutdown (the console excepted) or past max_client_conn, lets the pooler's own OS
user into the console as `pgbouncer` over the unix socket, and finds the user's secret:
from the auth_file (`load_auth`), or by auth_query on a server (`auth_query`, through
net/auth_query.py) when auth_user is set; then the password exchange starts
(net/client_login.py). `client_authenticated` gives the client its cancel key and sends
it to the console or into its pool (`enter_pool`), to be welcomed with the pool's server
parameters once a server has logged in.

The Pooler's methods of the same names hand over to these functions.

Never let `trust` in a user the pooler does not know, and never issue a guessable or
duplicate cancel key: one client could cancel another's queries.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
from typing import TYPE_CHECKING, Final

from ..auth.auth_file import load_auth_file
from ..core.states import ClientState
from ..net.auth_query import AuthQueryFailed, AuthQueryLoginFailed, run_auth_query
from ..protocol import cancel_key, errors
from ..protocol.errors import PoolerError
from . import auth_database, hba_login, replication, tracing

if TYPE_CHECKING:
    from ..net.records import ClientRecord
    from ..pooling.pool import Pool
    from ..settings import DatabaseEntry
    from .record import PoolerRecord as Pooler

log = logging.getLogger("pypool")

ADMIN_DATABASES: Final = ("pgbouncer", "pypool")
# PgBouncer's special console user: the pooler's own OS user, over the unix socket.
OWN_ADMIN_USER: Final = "pgbouncer"


def load_auth(pooler: Pooler) -> None:
    """(Re)read the auth_file. One that cannot be read keeps the users known so far
    (a reload must not lock everyone out because of a bad save)."""
    pooler.hba = hba_login.load(pooler.settings.pooler)
    known = dict(pooler.settings.inline_users)
    path = pooler.settings.pooler.auth_file
    if path:
        try:
            known.update(load_auth_file(path))
        except OSError as exc:
            log.error("auth_file %s: cannot read: %s; keeping the users known so far",
                      path, exc.strerror)
            return
        except UnicodeDecodeError as bad:  # own name: mypyc types a name by its first except
            log.error("auth_file %s: not UTF-8 (byte %d); keeping the users known so far",
                      path, bad.start)
            return
    pooler.auth_secrets = known


def client_connected(pooler: Pooler, client: ClientRecord) -> None:
    """A client's TCP or unix connection is up: it counts from now."""
    if client.state is not ClientState.STARTUP:
        return  # taken over from another process (-R): logged in, or refused, already
    pooler.clients.add(client)
    pooler.login_clients.add(client)


def begin_authentication(pooler: Pooler, client: ClientRecord) -> None:
    cfg = pooler.settings.pooler
    if pooler.wire_trace is not None:
        tracing.named(pooler, client)  # traced by its application_name
    if pooler.shutting_down and client.database not in ADMIN_DATABASES:
        # As PgBouncer 1.25: the unix socket, open until the exit, still lets the console
        # in (to see what the shutdown waits for, or KILL_CLIENT it), and no one else.
        raise PoolerError("pooler is shutting down", errors.ADMIN_SHUTDOWN)
    # The admin console stays reachable when the clients are at their cap, as PgBouncer
    # exempts it: that is when an operator needs it most.
    if len(pooler.clients) > cfg.max_client_conn and client.database not in ADMIN_DATABASES:
        raise PoolerError("no more connections allowed (max_client_conn)",
                          errors.TOO_MANY_CONNECTIONS)
    if (client.database in ADMIN_DATABASES and client.user == OWN_ADMIN_USER
            and client.peer_uid is not None and client.peer_uid == os.getuid()):
        # As PgBouncer's admin_pre_login: over the unix socket, the OS user running the
        # pooler reaches the console as `pgbouncer` with no password, whatever auth_type
        # and auth_file say (operators and PgBouncer's test suite log in so). Over TCP
        # the uid is unknown and `pgbouncer` is an ordinary user name.
        client.own_user = True
        pooler.client_counts.admit(pooler.settings, client)
        if cfg.log_connections:
            log.info("%r: pgbouncer access from unix socket", client)
        assert client.login is not None  # logging in
        client.login.start_auth(None, "trust")
        return
    pooler.client_counts.admit(pooler.settings, client)
    auth_type = cfg.auth_type
    if auth_type == "hba":  # the hba file picks the method for this client
        auth_type = hba_login.method_for(pooler.hba, client)
    secret = pooler.auth_secrets.get(client.user)
    if (secret is None and client.database in ADMIN_DATABASES and cfg.auth_user
            and auth_type != "any"):
        # A console user known to PostgreSQL only: auth_query through auth_dbname.
        via = auth_database.for_console(pooler.settings, pooler.disabled_dbs, client)
        pooler.spawn(auth_query(pooler, client, via, cfg.auth_user, auth_type, cfg.auth_query))
        return
    if secret is None and client.database not in ADMIN_DATABASES and auth_type != "any":
        entry = pooler.settings.database(client.database)
        auth_user = (entry and entry.auth_user) or cfg.auth_user
        if entry is not None and auth_user:
            # auth_dbname: the connection auth_query runs on (pooler/auth_database.py).
            via = auth_database.resolve(pooler.settings, pooler.disabled_dbs, entry, client)
            query = entry.auth_query or cfg.auth_query
            pooler.spawn(auth_query(pooler, client, via, auth_user, auth_type, query))
            return
    start_auth(client, secret, auth_type)


async def auth_query(pooler: Pooler, client: ClientRecord, entry: DatabaseEntry,
                     auth_user: str, auth_type: str, query: str) -> None:
    """Find `client`'s secret with auth_user's `query` on `entry`'s server, then start its
    password exchange (or refuse it)."""
    secret = None
    found = False
    try:
        found, secret = await run_auth_query(
            entry, auth_user,
            pooler.credentials_for(dataclasses.replace(entry, password=""), auth_user),
            query, client.user,
        )
    except AuthQueryLoginFailed as refused:
        # As a failed server login: logged, and the client told the server's words.
        log.warning("%r: server login failed: %s %s", client, refused.severity,
                    refused.message)
        client.fail(PoolerError(refused.message))
        return
    except AuthQueryFailed as broken:
        log.error("%r: auth_query failed: %s", client, broken)
        client.fail(PoolerError("bouncer config error"))
        return
    except Exception as failure:  # noqa: BLE001 - any other failure means "unknown user"
        log.warning("%r: auth_query failed: %s", client, failure)
    if secret:
        pooler.auth_query_secrets[client.user] = secret
    if auth_type == "trust" and not found and client.state is ClientState.STARTUP:
        # Trust asks for no password, so there is no exchange to mock and nothing to hide
        # (any known name logs in): as PgBouncer, the client hears that auth_query found
        # no such user. The password methods keep the mock exchange (COMPAT.md).
        log.info("%r: no such user: %s", client, client.user)
        client.fail(PoolerError("no such user"))
        return
    if client.state is ClientState.STARTUP:
        try:
            start_auth(client, secret, auth_type, known=found)
        except PoolerError as exc:
            client.fail(exc)


def client_authenticated(pooler: Pooler, client: ClientRecord,
                         scram_key: bytes | None) -> None:
    pooler.login_clients.discard(client)
    if scram_key is not None:
        pooler.scram_client_keys[client.user] = scram_key
    while True:
        # Unpredictable: a guessed key would let one client cancel another's queries.
        key = cancel_key.issue(secrets.randbits(31), secrets.randbits(32),
                               pooler.settings.pooler.peer_id, pooler.worker_index)
        if key not in pooler.cancel_keys:
            break
    client.cancel_key = key
    if client.database in ADMIN_DATABASES:
        if pooler.open_console is None:
            raise PoolerError(f"no such database: {client.database}",
                              errors.PROTOCOL_VIOLATION)
        pooler.open_console(client)
        return
    pool = enter_pool(pooler, client)
    if pooler.settings.pooler.application_name_add_host:
        # As PgBouncer: the peer's address after the name, set once, at login.
        name = client.params.get("application_name") or "app"
        client.params["application_name"] = f"{name} - {client.peer[0]}:{client.peer[1]}"
    pooler.cancel_keys[key] = client
    if replication.wants_own_server(client):
        replication.client_authenticated(pooler, client, pool)  # welcomed by its server
        return
    failing = pooler.login_failing(pool)
    if failing is not None:
        raise failing
    if pool.server_params is not None:
        client.welcome(pool.server_params)
        return
    pool.awaiting_params.append(client)
    pooler.launch_servers(pool)


def enter_pool(pooler: Pooler, client: ClientRecord) -> Pool:
    """The client joins the pool of its database and user (at login, or taken over by
    -R); an unknown or DISABLEd database refuses it."""
    entry = pooler.settings.database(client.database)
    if entry is None:
        raise PoolerError(f"no such database: {client.database}", errors.PROTOCOL_VIOLATION)
    pool = pooler.pool_for(client.database, client.user)
    assert pool is not None
    if pool.disabled:
        raise PoolerError(f'database "{client.database}" is disabled')
    client.pool = pool
    pool.clients.add(client)
    return pool


def start_auth(client: ClientRecord, secret: str | None, auth_type: str,
                known: bool = False) -> None:
    """As PgBouncer: trust lets in only users the pooler knows (auth_file, or found by
    auth_query, `known`, with or without a password)."""
    if auth_type == "trust" and secret is None and not known:
        raise PoolerError('"trust" authentication failed', side=errors.Side.CLIENT)
    assert client.login is not None  # logging in
    client.login.start_auth(secret, auth_type)
