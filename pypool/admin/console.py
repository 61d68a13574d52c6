"""The admin console session: simple queries answered from the pooler's own state.

Only SHOW VERSION for now; the full console is built on this entry point.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import __version__
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..protocol.framing import MessageBuffer

if TYPE_CHECKING:
    from ..net.client import ClientConnection
    from ..net.pooler import Pooler


class AdminSession:
    def __init__(self, pooler: Pooler, client: ClientConnection, is_admin: bool) -> None:
        self.pooler = pooler
        self.client = client
        self.is_admin = is_admin
        self._buffer = MessageBuffer()

    def received(self, data: bytes) -> None:
        self._buffer.feed(data)
        for kind, body in self._buffer.messages():
            if kind == m.QUERY:
                self.client.pending = 0
                self.client.write(self.answer(m.parse_query_text(body)))


    def answer(self, sql: str) -> bytes:
        words = sql.strip().rstrip(";").split()
        if [w.upper() for w in words] == ["SHOW", "VERSION"]:
            return (
                m.row_description([("version", 25)]) + m.data_row([f"pypool {__version__}"])
                + m.command_complete("SHOW") + m.ready_for_query()
            )
        return m.error_response(f"invalid command '{sql}', use SHOW HELP;", "08P01") + (
            m.ready_for_query()
        )


def open_console(pooler: Pooler, client: ClientConnection) -> None:
    cfg = pooler.settings.pooler
    is_admin = client.user in cfg.admin_users
    if not is_admin and client.user not in cfg.stats_users:
        raise PoolerError("not allowed")
    client.admin = AdminSession(pooler, client, is_admin)
    client.welcome({"server_version": "15.0", "client_encoding": "UTF8",
                    "server_encoding": "UTF8", "standard_conforming_strings": "on",
                    "DateStyle": "ISO", "TimeZone": "UTC", "integer_datetimes": "on",
                    "application_name": ""})
