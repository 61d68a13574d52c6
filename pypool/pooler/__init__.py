"""The running pooler: its objects, the linking of clients and servers, cancel, the
janitor, and its life from start through reloads to stop.

One Pooler per process (per worker) owns every connection and decides, through the sans-IO
Pool (pooling/pool.py), who gets which server. It sits above the asyncio Protocols of
net/ and below the console and metrics, which it calls only through the hooks cli.py sets
at start-up (net/hooks.py): nothing here imports admin/, observe/ or metrics.py.

- objects.py    the Pooler: the entry points the other layers call, each a hand-over
- record.py     its fields, as the parts below take it (PoolerRecord)
- client_logins.py  a client's admission, its secret (auth_file, auth_query), its cancel key
- teardown.py   a server or client that goes: its counts, its link, its server's fate
- linking.py    request_server, link, release, server_available: who gets which server
- server_logins.py  how many servers a pool opens, opening and logging them in, failed logins
- replication.py  replication clients: a dedicated server each, joined byte for byte
- transactions.py  each ReadyForQuery judged: release, keep (pinned by session state), close
- cancel.py     a client's CancelRequest, forwarded to the server it holds
- janitor.py    the timeouts, the pool sizes and the stats period, on a timer
- lifecycle.py  start, reload, pause, reconnect, shutdown and the signals

Never hand a server on with replies owed, never give a server mid-transaction to another
client: a client that leaves with its transaction open (or a query running) takes its server
down with it.
"""

from .objects import Pooler

__all__ = ["Pooler"]
