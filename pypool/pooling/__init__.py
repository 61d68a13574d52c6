"""Pool bookkeeping, sans-IO: who holds which server, who waits, and what to open or close.

The asyncio layer (`net/`) owns the sockets and calls in here to decide; nothing here
imports asyncio or touches a socket.
"""
