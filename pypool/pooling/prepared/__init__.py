"""Prepared statements that survive transaction pooling (`max_prepared_statements`).

A client prepares a statement in one transaction and binds it in a later one, which under
transaction pooling may run on another server. This package makes that work. It owns the
statement maps and the rewriting of Parse, Bind, Describe and Close; it takes client
messages and server replies as bytes and returns bytes and verdicts. It never touches a
socket and never imports asyncio: `net/client.py` and `net/server.py` are the glue.
docs/prepared-statements.md tells the same story for operators.

The files, bottom up (each imports only files listed before it):

  registry.py       Statement, the pooler-wide Registry, each client's ClientStatements
  requests.py       the vocabulary: a queued Request, what it waits for (Wait), what its
                    completion or skip does (Op), how replies are read (Tracking), the
                    verdicts on a reply (Verdict), the messages the pooler makes up
  request_queue.py  RequestQueue: the requests outstanding on a server, matched to replies
  cache.py          ServerCache: the per-server LRU of Statements, and forgetting it
  sql.py            SqlNames: SQL-level PREPARE / EXECUTE / DEALLOCATE / DISCARD, recognised
                    in a Query, and the names a server has prepared that way
  guard_statement.py  GuardStatement: the statement bound by the query_wait_timeout guard of
                    a pipelined client (the guard itself: pooling/pipeline_guard.py)
  rewriter.py       ServerStatements: one server's statements, the rewriting of the client's
                    messages for it, and what each settled request means

ServerStatements, the one object the glue holds per server, is composed, one part a field:
`requests` (RequestQueue), `cache` (ServerCache), `sql` (SqlNames), `guard`
(GuardStatement), and `client`, the linked client's ClientStatements. The parts queue
requests on `requests` and never call one another back: when a request settles, the queue
calls its owner (the `Outcomes` protocol, which ServerStatements implements), and
ServerStatements hands the work to the part that owns the request's Op.

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
  reply completes it (`Wait`), whether that reply is swallowed, and what to do when it
  completes or when the server skips it after an error (`Op`).

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
the whole segment to its ReadyForQuery. Two shapes are recognised whole, before any message
is looked at: a Bind of a named statement then Execute and Sync (`bind_segment`), and a
one-off query of the unnamed statement, Parse to Sync (`plain_segment`).

A rewrite relies on what the earlier requests will have done. Within one Sync segment an
error skips everything after it, so that holds; across segments it may not. So while a
request of an earlier segment may still be undone, a statement name is not looked up: the
rewriter returns `WAIT` and the glue holds the client's messages until the queue moves on.

Each server keeps at most max_prepared_statements; to make room, the least recently used
statement is closed (CloseComplete swallowed), unless it was used in the current link
(a portal made from it may still be open): then the cap is exceeded until the next link.

One Parse and one Bind, file by file
------------------------------------
A client logs in: net/client_login.py gives it a ClientStatements (registry.py). Each server
gets a ServerStatements (rewriter.py; net/records.py makes it), which builds its
RequestQueue, ServerCache, SqlNames and GuardStatement. When the pooler links the two,
`ServerStatements.attach(client)` counts the link in the request queue, which is the cache's
`epoch` (statements used from now on are not evicted in this link), and returns the hidden
PREPAREs of the client's SQL-level statements, if any (sql.py, `SqlNames.attach`).

1. The client sends Parse "s1" "SELECT $1::int", then Sync. core/frontend.py frames them
   and calls `ServerStatements.from_client` once per message.
   - rewriter.py, `from_client` -> `_parse`: the name is not empty, no earlier segment is
     undoable (`RequestQueue.must_wait`), "s1" is new to the client. `Registry.acquire`
     (registry.py) finds or makes the Statement for that body, PYPOOL_1, and
     `client.names[b"s1"]` points to it.
   - cache.py: the server lacks PYPOOL_1, so `ServerCache.admit` counts a miss, closes
     least recently used statements if the cap is reached (each a Request of Op.EVICT,
     Wait.CLOSE, reply swallowed), holds a reference and lists it in `lru`.
   - request_queue.py: `_parse` pushes Request(Wait.PARSE, Op.PARSE, PYPOOL_1, b"s1");
     the queue was empty, so `retrack` sets `tracking` to Tracking.EACH: replies are now
     read one by one. The bytes sent are Parse "PYPOOL_1" with the client's body.
   - The Sync: `_sync` asks `RequestQueue.fold` whether the segment can be folded; a named
     Parse needs its reply read (`open_fine`), so no: PLAIN_SYNC is queued behind it
     (`close_segment`), and the Sync is sent as it is.
2. The server answers ParseComplete, ReadyForQuery. core/replies.py sees `tracking` and
   gives each reply to `RequestQueue.reply`:
   - ParseComplete completes the head (requests.py, COMPLETES): it is popped, and
     `_settle` tells the owner, `ServerStatements.settled`, which gives Op.PARSE to
     `ServerCache.settled`: ok, PYPOOL_1 stays listed. Verdict.FORWARD: the client gets it.
     The Sync is at the head now: `retrack` sets Tracking.HOT, and the ReadyForQuery goes
     by on core/replies.py's hot path, which calls `RequestQueue.pop_ready`. The queue is
     empty, and the link may be released.
3. A later transaction, on another server that has never seen PYPOOL_1: Bind "" "s1",
   Execute, Sync (PQexecPrepared). `attach` runs for the new link first.
   - core/frontend.py first offers the whole segment to `ServerStatements.bind_segment`
     (the steady state, folded in one step); the statement is not in this server's `lru`,
     so it declines and the messages go one by one.
   - rewriter.py, `_bind`: `client.names[b"s1"]` is PYPOOL_1. `ServerCache.ensure`
     (cache.py) finds it missing and `inject`s it: a Request(Wait.PARSE, swallowed,
     Op.INJECT) and the bytes of Parse "PYPOOL_1". Then the Bind is rewritten to name
     PYPOOL_1 and queued as Request(Wait.BIND, Op.NAMED, PYPOOL_1, b"s1"), to put "s1"
     back in the server's error if it fails.
   - Execute is a plain request (PLAIN_EXECUTE). The Sync: the segment holds an injected
     Parse (`open_fine`), so nothing is folded.
   - The replies: the injected ParseComplete is swallowed (Verdict.SWALLOW) and settles
     Op.INJECT in the cache; BindComplete, the rows, CommandComplete and ReadyForQuery go
     to the client.
4. The same Bind again on that server: `bind_segment` finds PYPOOL_1 in the `lru` (a hit),
   renames the Bind and queues one Request(Wait.SYNC, Op.RENAME) standing for the whole
   segment, with `tracking` Tracking.HOT: the replies go through core/replies.py's hot path,
   which reads headers only (and an ErrorResponse, to put "s1" back in it:
   `RequestQueue.renamed_error`).

Had the server failed that Bind (say 26000: the statement was dropped behind the pooler's
back), `RequestQueue.reply` would put "s1" for PYPOOL_1 in the error (Verdict.REPLACE) and,
for 26000, call the owner's `distrust`: the cache, the SQL-level names and the guard
statement each forget what they knew, each in its own part. Then it skips the queue to the
Sync (`_skip_to_sync`), settling the skipped requests as failed, last first (had the
injected Parse itself failed, the cache would forget PYPOOL_1 again, and the client map
keep "s1").
"""

from .guard_statement import GUARD_NAME
from .registry import PREFIX, PROBE, ClientStatements, Registry, Statement, totals
from .request_queue import RequestQueue
from .requests import FORWARD, READY, REPLACE, SWALLOW, WAIT, Hold, Op, Request, Tracking
from .rewriter import ServerStatements, driver_segment, unnamed_segment
from .sql import SqlCommand, parse_sql_command

__all__ = [
    "FORWARD", "GUARD_NAME", "PREFIX", "PROBE", "READY", "REPLACE", "SWALLOW", "WAIT",
    "ClientStatements", "Hold", "Op", "Registry", "Request", "RequestQueue", "ServerStatements",
    "SqlCommand", "Statement", "Tracking", "driver_segment", "parse_sql_command", "totals",
    "unnamed_segment",
]
