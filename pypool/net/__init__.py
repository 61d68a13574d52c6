"""The asyncio layer: the client and server Protocols, pipelining, flow control, auth_query.

Thin glue around the sans-IO core. The hot path lives in the two `data_received` methods:
they walk 5-byte message headers, forward bodies as they arrive, and parse only the few
messages the pooler must understand.
"""
