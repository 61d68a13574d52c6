"""The asyncio layer: the client and server Protocols, pipelining, flow control, auth_query.

Beside the two Protocols (client.py, server.py) sit their fields (client_record.py,
server_record.py: what the pooler knows about each connection), their logins
(client_login.py, server_login.py) and what they act through: a client's outbox and its
rewriting at the link (outbox.py), the pooler's own queries on a server
(hidden_queries.py), writes deferred to the end of a loop round (deferred_writes.py).
They see the running pooler only as port.py's PoolerPort: nothing here imports pooler/.

Thin glue around the sans-IO core. The hot path lives in the two `data_received` methods:
they walk 5-byte message headers, forward bodies as they arrive, and parse only the few
messages the pooler must understand.
"""
