"""The asyncio layer: the client and server Protocols, pipelining, flow control, auth_query.

Beside the two Protocols (client.py, server.py) sit their fields (records.py: what the
pooler knows about each connection, the calls made on it, and the pooler as they see it,
its PoolerPort), their logins (client_login.py, server_login.py, with TLS's handshakes in
tls_handshake.py) and what they act through: a client's outbox and its rewriting at the
link (outbox.py), the pooler's own queries on a server (hidden_queries.py), writes deferred
to the end of a loop round (deferred_writes.py). Everything here takes the records, not
the two Protocols, so nothing imports client.py or server.py but what makes them; and they
see the running pooler only as its PoolerPort: nothing here imports pooler/.

Thin glue around the sans-IO core. The hot path lives in the two `data_received` methods:
they walk 5-byte message headers, forward bodies as they arrive, and parse only the few
messages the pooler must understand.
"""
