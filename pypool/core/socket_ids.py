"""One id sequence for every socket the pooler holds, clients and servers alike.

PgBouncer numbers client and server sockets from one counter, so the `id` column of SHOW
CLIENTS, SHOW SERVERS and SHOW SOCKETS never repeats between them and KILL_CLIENT's argument
can only mean one connection. Tools compare these ids across the three SHOWs.
"""

from __future__ import annotations

socket_ids = iter(range(1, 1 << 62))
