"""The pooler's own queries on a server, whose replies no client sees.

A server runs queries of the pooler's own besides its clients': server_check_query before a
server that was free for server_check_delay serves again, the SET that gives it the linked
client's session parameters (client_encoding, TimeZone, ...) and the session settings that
follow their client (pooling/session_state.py), the reset query, connect_query. Each is a
simple Query sent with `send_hidden_query` (or `send_parameters`) and told to the server's
BackendLedger first (core/backend.py), so the reply reader (core/replies.py) swallows its
replies and says, at its ReadyForQuery, how it went.

At a link (`prepare_for`) the client's requests wait for the check's and the SET's replies:
`hidden_outcome` tells the pooler (pooler/linking.py) `parameters_applied`, `check_failed`
or `parameters_failed`. A SET that fails must not let the client's transaction run under
settings it did not ask for.

The bookkeeping lives in the BackendLedger; whose requests wait is the linked client's
(its link is SETTING, core/link.py). This module sends and settles. It never links or
releases a server itself.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..core import backend as backend_ledger
from ..core.backend import HIDDEN_CHECK, HIDDEN_PLAIN
from ..core.link import LinkState
from ..pooling.params import set_statements
from ..pooling.session_state import SESSION_SETTINGS
from ..protocol import messages as m

if TYPE_CHECKING:
    from .records import ClientRecord, ServerRecord

log = logging.getLogger("pypool.server")


def send_hidden_query(server: ServerRecord, sql: str, purpose: int = HIDDEN_PLAIN) -> None:
    """Send a query whose replies the client must not see (core/backend.py).

    One that may drop prepared statements (the DISCARD ALL after a pinned client, a reset
    query) makes the server's statements untrusted now, as it is sent, not at its reply:
    the next client may be linked before that comes, and what its requests are rewritten
    into runs after it on the server, so each of its statements is prepared again (closed
    first, should it have survived). Its reply then changes nothing: it is the pooler's,
    not the linked client's, whose own statements stay."""
    if _may_drop_statements(sql):
        server.statements.distrust("a query of the pooler's own may drop them")
    server.reader.hide(purpose)
    server.send(m.query(sql), True)


def _may_drop_statements(sql: str) -> bool:
    """Whether a query of the pooler's own may drop prepared statements (DISCARD ALL,
    DEALLOCATE ALL, in any case and among other statements)."""
    lowered = sql.lower()
    return "discard" in lowered or "deallocate" in lowered


# server_check_query's spelling of "send an empty query" (an empty value turns the check off).
EMPTY_QUERY = "<empty>"


def prepare_for(server: ServerRecord, client: ClientRecord, check_query: str,
                session_sql: bytes = b"") -> None:
    """What must succeed before `client`'s requests may go: `check_query` (if any),
    then a SET of the parameters whose values differ from the client's, and
    `session_sql`, which gives this server the client's other settings. The pooler is
    told how it went (parameters_applied, check_failed, parameters_failed)."""
    if check_query:
        # `<empty>` (the default, as PgBouncer 1.25's): an empty Query, the cheapest there is.
        send_hidden_query(server, "" if check_query == EMPTY_QUERY else check_query,
                          HIDDEN_CHECK)
    if session_sql or not server.reader.covers(client.params):
        send_parameters(server, client, session_sql)


def send_parameters(server: ServerRecord, client: ClientRecord,
                    session_sql: bytes = b"") -> None:
    """SET the parameters whose values differ from the linked `client`'s. Its requests
    wait for the reply (pooler.parameters_applied): if the SET fails, they must not run
    under the wrong client_encoding or TimeZone.

    PostgreSQL sends a ParameterStatus only when a value changes: a SET of another
    spelling of the current value (client_encoding 'utf-8' for UTF8, DateStyle ISO for
    "ISO, MDY") changes nothing and says nothing. So once the SET has succeeded, the
    client's values become the server's, whichever way it went; else the next link would
    send the same SET again."""
    wanted = client.params
    params = server.params
    names = [name for name, value in wanted.items() if params.get(name) != value]
    sql = set_statements(wanted, params).encode()
    if session_sql:
        names.append(SESSION_SETTINGS)  # so the SET is judged even with no name above
        # The other client's settings undone and this one's made, then the tracked ones.
        sql = b"; ".join([part for part in (session_sql, sql) if part])
    server.reader.hide_parameters(names)
    if log.isEnabledFor(logging.DEBUG):  # in PgBouncer's words, for whoever greps them
        for name in names:
            if name in wanted:
                log.debug("%r: varcache_apply: SET %s='%s'", server, name,
                          wanted[name].replace("'", "''"))
    server.send(m.message(m.QUERY, sql + b"\x00"), True)


def hidden_outcome(server: ServerRecord, outcome: int) -> None:
    """A pooler-issued query settled (core/backend.py says how)."""
    client = server.client
    if client is not None and client.link.state is not LinkState.SETTING:
        client = None  # it left meanwhile (or the query was none of a link's)
    backend = server.backend
    pooler = server.pooler
    if outcome == backend_ledger.CHECK_FAILED:
        pooler.check_failed(server, client, backend.last_error.get("M", ""))
        return
    if client is None:
        return
    if outcome == backend_ledger.SET_FAILED:
        pooler.parameters_failed(server, client, backend.last_error)
        return
    params = server.params
    for name in backend.applied:
        if name in params:
            value = params[name]
            if client.params.get(name) != value:
                # Another spelling of the same value (DateStyle ISO for "ISO, MDY"): the
                # server's is kept, so the next link sends no SET.
                log.debug("%r: varcache_set_canonical: setting %s to its canonical version "
                          "%s -> %s", client, name, client.params.get(name, ""), value)
            client.params[name] = value  # the client sees it changed
    pooler.parameters_applied(server, client)
