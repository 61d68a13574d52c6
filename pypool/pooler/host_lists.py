"""`host=a,b,c` in [databases]: which host a new server connection goes to.

As PgBouncer: with `load_balance_hosts = round-robin` (the default) each new connection
takes the next host of the list; with `disable` connections keep to one host until a
connection to it fails, then move to the next. A failed connection to one host of a list is
retried at once on the next one, until every host has failed in a row: only then is it a
failed server login (server_login_retry, the clients told). A single host behaves as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..settings import DatabaseEntry


class HostChooser:
    """Per database: the host the next connection uses, and failures in a row."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}
        self._failures: dict[str, int] = {}

    def pick(self, entry: DatabaseEntry) -> str:
        hosts = entry.hosts
        if len(hosts) == 1:
            return hosts[0]
        index = self._next.get(entry.name, 0) % len(hosts)
        if entry.load_balance_hosts == "round-robin":
            self._next[entry.name] = index + 1
        return hosts[index]

    def failed(self, entry: DatabaseEntry) -> bool:
        """A connection to the host `pick` gave failed. True: try the next host now; False:
        every host has failed in a row (or there is only one), a login failure."""
        hosts = entry.hosts
        if len(hosts) == 1:
            return False
        if entry.load_balance_hosts != "round-robin":
            self._next[entry.name] = self._next.get(entry.name, 0) + 1
        failures = self._failures.get(entry.name, 0) + 1
        if failures >= len(hosts):
            self._failures.pop(entry.name, None)
            return False
        self._failures[entry.name] = failures
        return True

    def connected(self, entry: DatabaseEntry) -> None:
        self._failures.pop(entry.name, None)
