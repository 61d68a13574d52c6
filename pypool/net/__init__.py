"""The asyncio layer: client and server Protocols, the listener, cancel forwarding, signals.

Thin glue around the sans-IO core. The hot path lives in the two `data_received` methods:
they walk 5-byte message headers, forward bodies as they arrive, and parse only the few
messages the pooler must understand.
"""
