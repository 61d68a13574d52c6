"""The StartupMessage's `replication` parameter: what a replication client asks for, and
what its dedicated server is sent.

A client that logs in with `replication` set wants a walsender, not a backend: `database`
asks for logical replication (SQL works, and the replication commands IDENTIFY_SYSTEM,
CREATE_REPLICATION_SLOT, START_REPLICATION ... LOGICAL), a true boolean (true, on, yes, 1
and their prefixes, as PostgreSQL's parse_bool reads them) for physical replication (the
replication commands only: pg_basebackup, pg_receivewal). A false boolean is an ordinary
login. The pooler serves such a client as PgBouncer 1.23+ does (pooler/replication.py): a
server of its own, logged in with the same `replication` value, its session parameters and
its `options` word for word, since a physical walsender refuses SET.

Never here: sockets, the pooler's objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from . import errors
from .errors import PoolerError
from .messages import TERMINATE

# What SHOW CLIENTS and SHOW SERVERS say in their `replication` column (PgBouncer's words).
NONE: Final = "none"
PHYSICAL: Final = "physical"
LOGICAL: Final = "logical"

# The value sent to the server for each kind.
_SERVER_VALUE: Final = {PHYSICAL: "true", LOGICAL: "database"}

# PostgreSQL's parse_bool: these words, and any prefix of them that names one (so "o" is
# neither, "of" is off), in any case.
_TRUE_WORDS: Final = ("true", "yes")
_FALSE_WORDS: Final = ("false", "no")


def _boolean(text: str) -> bool | None:
    value = text.lower()  # PostgreSQL's parse_bool: any case, no blanks
    if not value:
        return None
    if value in ("on", "1"):
        return True
    if value in ("off", "of", "0"):
        return False
    if any(word.startswith(value) for word in _TRUE_WORDS):
        return True
    if any(word.startswith(value) for word in _FALSE_WORDS):
        return False
    return None


def kind(params: Mapping[str, str]) -> str:
    """NONE, PHYSICAL or LOGICAL, from a StartupMessage's parameters. A value PostgreSQL
    would not accept fails the login with its words."""
    value = params.get("replication")
    if value is None:
        return NONE
    if value == "database":  # exactly so: PostgreSQL compares it case-sensitively
        return LOGICAL
    flag = _boolean(value)
    if flag is None:
        raise PoolerError(f'invalid value for parameter "replication": "{value}"',
                          errors.INVALID_PARAMETER_VALUE, side=errors.Side.CLIENT)
    return PHYSICAL if flag else NONE


def kind_or_none(params: Mapping[str, str]) -> str:
    """`kind`, reading a value it would refuse as NONE (for SHOW, after a login)."""
    try:
        return kind(params)
    except PoolerError:
        return NONE


def tracked_part(params: dict[str, str], replication: str) -> dict[str, str]:
    """The parameters the pooler reads session settings from: all of them for an ordinary
    login; for a replication one all but `options`, which goes to its server as it came
    (so it may set anything, extra_float_digits as CREATE SUBSCRIPTION does, or nothing
    the pooler knows)."""
    if replication == NONE or "options" not in params:
        return params
    return {key: value for key, value in params.items() if key != "options"}


def server_startup(replication: str, client_startup: dict[str, str],
                   client_params: dict[str, str],
                   entry_startup: dict[str, str]) -> dict[str, str]:
    """The StartupMessage parameters (besides user and database) of a replication client's
    own server: the [databases] entry's, then the client's session settings over them, its
    `options` untouched, and `replication`."""
    startup = dict(entry_startup)
    startup.update(client_params)
    options = client_startup.get("options")
    if options:
        startup["options"] = options
    startup["replication"] = _SERVER_VALUE[replication]
    return startup


class TerminateWatch:
    """Where a replication client's messages begin, to find its Terminate among them.

    The pipe (net/replication_pipe.py) passes the client's bytes on as they come; this
    follows only the framing (a type byte, a length that counts itself) across the chunks,
    so that the pipe sees the client's Terminate as the client leaving ("client sent
    Terminate"), whichever of the two sockets the loop then sees close first. A length
    below 4 is PostgreSQL's to refuse: the watch stops looking and the bytes still go on.
    """

    def __init__(self) -> None:
        self._header = bytearray()  # a message header split across chunks
        self._body_left = 0  # bytes of the current message's body still to come
        self._lost = False  # a bad length: the framing is PostgreSQL's problem now

    def end_of_terminate(self, data: bytes) -> int:
        """The offset just past a Terminate in `data`, or -1 when there is none."""
        if self._lost:
            return -1
        size = len(data)
        at = 0
        while at < size:
            if self._body_left:
                step = min(self._body_left, size - at)
                self._body_left -= step
                at += step
                continue
            need = 5 - len(self._header)
            self._header += data[at:at + need]
            at += min(need, size - at)
            if len(self._header) < 5:
                return -1
            length = int.from_bytes(self._header[1:5], "big")
            kind = self._header[0]
            self._header.clear()
            if length < 4:
                self._lost = True
                return -1
            if kind == TERMINATE and length == 4:
                return at
            self._body_left = length - 4  # a longer 'X' is PostgreSQL's to refuse
        return -1
