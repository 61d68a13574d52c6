"""The PostgreSQL frontend/backend protocol 3.0, sans-IO: framing, message builders and parsers.

Nothing in this package touches a socket or imports asyncio: it turns bytes into values and
values into bytes, so it can be tested by feeding it bytes.
"""
