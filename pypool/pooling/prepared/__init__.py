"""Prepared statements that survive transaction pooling (`max_prepared_statements`).

A client prepares a statement in one transaction and binds it in a later one, which under
transaction pooling may run on another server. This package makes that work. It owns the
statement maps and the rewriting of Parse, Bind, Describe and Close; it takes client
messages and server replies as bytes and returns bytes and verdicts. It never touches a
socket and never imports asyncio: `net/client.py` and `net/server.py` are the glue.
docs/prepared-statements.md tells the same story for operators.

  registry.py       Statement, the pooler-wide Registry, each client's ClientStatements
  requests.py       the request queue's vocabulary: waits, undo operations, verdicts, messages
  request_queue.py  RequestQueue: the requests outstanding on a server, matched to replies
  cache.py          ServerCache: the per-server LRU of Statements, and distrusting it
  sql.py            SqlNames: SQL-level PREPARE / EXECUTE / DEALLOCATE / DISCARD, recognised
                    in a Query, and the names a server has prepared that way
  guard.py          Guards: the query_wait_timeout guard sent before a pipelined client's
                    transaction, and the pooler's statement it binds
  rewriter.py       ServerStatements: the rewriting of the client's messages for a server

ServerStatements, the one class the glue holds per server, is built in layers, one a module:
ServerStatements(Guards(SqlNames(ServerCache(RequestQueue)))). A lower layer leaves what a
settled request means to the ones above (`_settled`, `_command_tag`, `distrust`,
`_guard_error`), and single inheritance keeps every attribute one field access away,
compiled.

Theory of operation
-------------------
Four pieces of state:

* `Registry` (one per pooler): a `Statement` per distinct Parse body (query text plus
  parameter types), with one server-side name `PYPOOL_<n>`, reference counted by the
  clients, servers and queued requests that use it.
* `ClientStatements` (per client): the client's statement names mapped to Statements, and
  its SQL-level `PREPARE`s (name -> text), together capped by
  max_client_prepared_statements.
* `ServerStatements` (per server): an LRU of the Statements prepared there, bounded by
  max_prepared_statements; the SQL-level names prepared there; the queue of requests
  outstanding on the link; `client`, the linked client's ClientStatements.
* The request queue: one entry per request sent to the server on the client's behalf, or
  answered by the pooler itself, in the order the client sent them. Each entry says which
  reply completes it (`W_*`), whether that reply is swallowed, and what to do when it
  completes or when the server skips it after an error (`OP_*`).

What happens to each client message (`PYPOOL_n` is the server-side name):

  Parse "s"      server lacks the body: Parse "PYPOOL_n" sent, its reply forwarded
                 server has it: nothing sent, ParseComplete synthesised in its turn (or, when
                 the server may be in a failed transaction, the body parsed under PYPOOL_0
                 and closed, so the server answers 25P02 as it would)
                 s already exists: sent as a Parse of a name the server has, so the server
                 fails it exactly as PostgreSQL would (42P05, or a syntax error first, or
                 25P02) and skips to the Sync; the error names "s"
  Bind/Describe  server lacks the body: Parse "PYPOOL_n" injected first, reply swallowed
    "s"          s unknown: the server fails a Describe of PYPOOL_0 in its place, and its
                 error is replaced by PostgreSQL's 26000 for "s"
  Close "s"      mapping dropped, CloseComplete synthesised; the server keeps the plan
  unnamed        Parse "", Bind of "", portals: passed through untouched
  PREPARE/EXECUTE/DEALLOCATE name as a simple Query: SQL-level statements keep the client's
                 own name on the server (the SQL text refers to it). They are made to exist
                 on every server the client lands on (hidden PREPAREs at link time), and a
                 same-named statement of another client is deallocated first. EXECUTE and
                 DEALLOCATE of a protocol-level statement use its server-side name.

Errors are never made up where the server can be made to produce them: the server then
aborts a transaction block and skips to the Sync exactly as a direct connection would.
When it reports an ErrorResponse for an extended-protocol request, queued entries up to the
next Sync are dropped and their optimistic effects undone in reverse order (a failed Parse
is forgotten by the server map and the client map, a skipped Close is undone).
`DEALLOCATE ALL` and `DISCARD ALL`, seen in CommandComplete tags, clear the maps.

Some statements change the server's prepared statements where the pooler cannot follow (a
DO block running `EXECUTE 'DEALLOCATE ALL'`, a DEALLOCATE in a multi-statement query, a
function). After one, or when the server answers 26000 for a name the pooler gave it, the
server's cache is distrusted (`ServerStatements.distrust`): forgotten, each statement parsed
again where next used and closed first in case it survived (`stale`), SQL-level names kept
as UNSURE and dropped with a Close, which never fails, before anyone prepares them.

Replies are read one by one only while the request at the head of the queue needs it. When
a Sync closes a segment of plain requests (Bind and Execute of statements the server has:
the steady state of every driver), they are folded into the Sync, and the hot path carries
the whole segment to its ReadyForQuery.

A rewrite relies on what the earlier requests will have done. Within one Sync segment an
error skips everything after it, so that holds; across segments it may not. So while a
request of an earlier segment may still be undone, a statement name is not looked up: the
rewriter returns `WAIT` and the glue holds the client's messages until the queue moves on.

Each server keeps at most max_prepared_statements; to make room, the least recently used
statement is closed (CloseComplete swallowed), unless it was used in the current link
(a portal made from it may still be open): then the cap is exceeded until the next link.
"""

from .guard_statement import GUARD_NAME
from .registry import PREFIX, PROBE, ClientStatements, Registry, Statement, totals
from .request_queue import RequestQueue
from .requests import FORWARD, READY, REPLACE, SWALLOW, WAIT, Hold, Op, Request, Tracking
from .rewriter import ServerStatements, driver_segment
from .sql import SqlCommand, parse_sql_command

__all__ = [
    "FORWARD", "GUARD_NAME", "PREFIX", "PROBE", "READY", "REPLACE", "SWALLOW", "WAIT",
    "ClientStatements", "Hold", "Op", "Registry", "Request", "RequestQueue", "ServerStatements",
    "SqlCommand", "Statement", "Tracking", "driver_segment", "parse_sql_command", "totals",
]
