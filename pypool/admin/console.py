"""The admin console session: simple queries on the virtual database `pgbouncer` (or `pypool`).

`open_console` runs after authentication: users in admin_users (and `pgbouncer` from the
pooler's own OS user over the unix socket) may run everything, users in stats_users only
SHOW, anyone else is turned away with PgBouncer's FATAL "not allowed". Each Query is parsed
as PgBouncer's admin.c parses it (`CMD [arg]` or `SET key = value`, words case-insensitive,
"double quotes" for names), dispatched to show.py or commands.py, and answered in order:
while a PAUSE or WAIT_CLOSE waits, later queries queue behind it. A refused command is a
non-fatal ERROR 08P01 and the session carries on.

This module owns the conversation, not the pooler's state: it never changes a pool itself.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from typing import Any, Protocol

from ..observe.view import PoolerView, StateName, is_closed
from ..protocol import errors
from ..protocol import messages as m
from ..protocol.errors import PoolerError
from ..protocol.framing import MessageBuffer
from . import commands, show
from .commands import AdminError, InvalidCommand, Reply, WaitFor
from .control import PoolerControl

log = logging.getLogger("pypool.admin")

# PgBouncer's grammar (admin.c), with SET values a little more lenient (500ms, 1.5 unquoted).
_WORD = r'("(?:[^"]|"")*"|[0-9a-z_]+)'
_CMD = re.compile(rf"^\s*{_WORD}(?:\s+{_WORD})?\s*(?:;\s*)?$", re.IGNORECASE)
_SET_STR = re.compile(rf"^\s*set\s+{_WORD}\s*(?:=|to)\s*('(?:[^']|'')*')\s*(?:;\s*)?$",
                      re.IGNORECASE)
_SET_WORD = re.compile(rf"^\s*set\s+{_WORD}\s*(?:=|to)\s*([^\s;']+)\s*(?:;\s*)?$",
                       re.IGNORECASE)
# TRACE <client id|application_name> on|off (pypool's own: pooler/tracing.py)
_TRACE = re.compile(r"^\s*trace\s+('(?:[^']|'')*'|\S+)\s+(\w+)\s*(?:;\s*)?$", re.IGNORECASE)

WAIT_POLL = 0.05  # seconds between checks while PAUSE or WAIT_CLOSE waits

# What the console's ParameterStatus says, as PgBouncer's admin_setup() sends it.
WELCOME = {
    "server_version": f"{show.PGBOUNCER_VERSION}/bouncer",
    "client_encoding": "UTF8",
    "server_encoding": "UTF8",
    "DateStyle": "ISO",
    "TimeZone": "GMT",
    "standard_conforming_strings": "on",
    "is_superuser": "on",
    "integer_datetimes": "on",
}


class Ledger(Protocol):
    def ready(self) -> object: ...


class ConsoleClient(Protocol):
    """The client connection a console session talks to (net/client.py's is one)."""

    admin: Any  # the session, once admitted; read by the connection for what it receives

    @property
    def user(self) -> str: ...
    @property
    def own_user(self) -> bool: ...
    @property
    def state(self) -> StateName: ...
    @property
    def ledger(self) -> Ledger: ...
    def write(self, data: bytes) -> None: ...
    def welcome(self, server_params: dict[str, str]) -> None: ...


def _unquote(text: str | None, quote: str = '"') -> str:
    if not text:
        return ""
    if len(text) >= 2 and text[0] == quote and text[-1] == quote:
        return text[1:-1].replace(quote * 2, quote)
    return text


class AdminSession:
    """One console connection: queued queries in, answers out, in order."""

    def __init__(self, view: PoolerView, pooler: PoolerControl, client: ConsoleClient,
                 is_admin: bool) -> None:
        self.view = view
        self.pooler = pooler
        self.client = client
        self.is_admin = is_admin
        self._buffer = MessageBuffer()
        self._queries: deque[str] = deque()
        self._waiting: asyncio.Task[None] | None = None

    def received(self, data: bytes) -> None:
        self._buffer.feed(data)
        for kind, body in self._buffer.messages():
            if kind == m.QUERY:
                self._queries.append(m.parse_query_text(body))
        self._answer_queued()

    def _answer_queued(self) -> None:
        while self._queries and self._waiting is None and self._open:
            sql = self._queries.popleft()
            self.pooler.console_queries += 1  # SHOW STATS' pgbouncer row, SHOW TOTALS
            self.client.ledger.ready()  # answered here, not by a server
            self._answer(sql)

    @property
    def _open(self) -> bool:
        return not is_closed(self.client)

    def _answer(self, sql: str) -> None:
        try:
            reply = self.dispatch(sql)
        except InvalidCommand:
            self._error(f"invalid command '{sql}', use SHOW HELP;")
            return
        except AdminError as exc:
            self._error(exc.message, exc.sqlstate)
            return
        if isinstance(reply, bytes):
            self.client.write(reply + m.ready_for_query())
        elif isinstance(reply, WaitFor):
            self._waiting = asyncio.get_running_loop().create_task(self._wait(reply))
        elif reply.tag:
            notice = m.notice_response(reply.notice) if reply.notice else b""
            self.client.write(notice + m.command_complete(reply.tag) + m.ready_for_query())
            if reply.then is not None:
                reply.then()

    def _error(self, message: str, sqlstate: str = errors.PROTOCOL_VIOLATION) -> None:
        log.warning("%r: console: %s", self.client, message)
        self.client.write(m.error_response(message, sqlstate) + m.ready_for_query())

    async def _wait(self, reply: WaitFor) -> None:
        try:
            while self._open and not reply.until():
                await asyncio.sleep(WAIT_POLL)
            if self._open:
                self.client.write(m.command_complete(reply.tag) + m.ready_for_query())
        finally:
            self._waiting = None
        self._answer_queued()

    # --- parsing and dispatch -------------------------------------------------------------

    def dispatch(self, sql: str) -> bytes | Reply:
        """The answer to one query: bytes of a result set (up to CommandComplete), or a Reply."""
        match = _TRACE.match(sql)
        if match:
            if not self.is_admin:
                raise AdminError("admin access needed")
            return commands.trace(self.pooler, _unquote(match.group(1), "'"), match.group(2))
        match = _CMD.match(sql)
        if match:
            return self._command(_unquote(match.group(1)).lower(), _unquote(match.group(2)))
        for pattern, quote in ((_SET_STR, "'"), (_SET_WORD, '"')):
            match = pattern.match(sql)
            if match:
                key = _unquote(match.group(1))
                return commands.set_param(self.pooler, key, _unquote(match.group(2), quote),
                                          self.is_admin)
        raise InvalidCommand(sql)

    def _command(self, name: str, arg: str) -> bytes | Reply:
        if name in ("show", "select"):
            return self._show(arg)
        command = commands.COMMANDS.get(name)
        if command is None or (arg and name in commands.NO_ARGUMENT):
            raise InvalidCommand(name)
        if not self.is_admin:
            raise AdminError("admin access needed")
        return command(self.pooler, arg)

    def _show(self, what: str) -> bytes:
        key = what.lower()
        if key == "help":
            return _help_notice() + m.command_complete("SHOW")
        fake = show.FAKE_PARAMS.get(key)
        if fake is not None:
            rows = show.result("s", key, [(fake,)])
            return rows.encode() + m.command_complete("SHOW")
        build = show.SHOWS.get(key)
        if build is None:
            raise InvalidCommand(what)
        if key == "fds" and not self.is_admin:  # file descriptors are an admin's business
            raise AdminError("admin access needed")
        return build(self.view).encode() + m.command_complete("SHOW")


def _help_notice() -> bytes:
    fields = (b"SNOTICE\x00" + b"C00000\x00" + b"MConsole usage\x00"
              + b"D" + show.HELP.encode() + b"\x00" + b"\x00")
    return m.message(m.NOTICE_RESPONSE, fields)


def open_console(view: PoolerView, pooler: PoolerControl, client: ConsoleClient) -> None:
    """After authentication to `pgbouncer`/`pypool`: admit admin and stats users, welcome.

    SHOWs read `view`; commands drive `pooler`. cli.py's build_pooler binds both, once, into
    the pooler's open_console hook."""
    cfg = view.settings.pooler
    # own_user: `pgbouncer` from the pooler's own OS user over the unix socket (admin_pre_login)
    is_admin = client.own_user or client.user in cfg.admin_users
    if not is_admin and client.user not in cfg.stats_users:
        raise PoolerError("not allowed")
    client.admin = AdminSession(view, pooler, client, is_admin)
    client.welcome(dict(WELCOME))


__all__ = ["AdminSession", "open_console"]
