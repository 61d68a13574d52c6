"""Errors the pooler raises and sends, each with a SQLSTATE and a side.

A client that breaks the protocol (`ClientProtocolError`) and a server that misbehaves
(`ServerProtocolError`) are different failures: the first closes one client, the second one
server connection. `PoolerError` is an error the pooler itself reports to a client, with
PgBouncer's message text where PgBouncer has one (see COMPAT.md).
"""

from __future__ import annotations

from enum import Enum


class Side(Enum):
    CLIENT = "client"
    SERVER = "server"
    POOLER = "pooler"


# SQLSTATEs the pooler uses itself.
PROTOCOL_VIOLATION = "08P01"
INVALID_PASSWORD = "28P01"
INVALID_AUTHORIZATION = "28000"
INVALID_CATALOG_NAME = "3D000"
TOO_MANY_CONNECTIONS = "53300"
ADMIN_SHUTDOWN = "57P01"
CANNOT_CONNECT_NOW = "57P03"  # the database system is starting up, shutting down, ...
QUERY_CANCELED = "57014"
FEATURE_NOT_SUPPORTED = "0A000"
PROGRAM_LIMIT_EXCEEDED = "54000"
DUPLICATE_PREPARED_STATEMENT = "42P05"
INVALID_SQL_STATEMENT_NAME = "26000"
CONNECTION_FAILURE = "08006"
INVALID_PARAMETER_VALUE = "22023"


class PoolerError(Exception):
    """An error the pooler sends to a client as an ErrorResponse.

    `fatal` errors close the client connection after the message is sent.
    """

    def __init__(
        self,
        message: str,
        sqlstate: str = PROTOCOL_VIOLATION,
        *,
        fatal: bool = True,
        side: Side = Side.POOLER,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.fatal = fatal
        self.side = side


# What a client the pooler stops serving is told (PgBouncer's words): a shutdown, or -R
# leaving it behind.
SHUTTING_DOWN = "server shutting down"


def shutting_down() -> PoolerError:
    return PoolerError(SHUTTING_DOWN, ADMIN_SHUTDOWN)


class ClientProtocolError(PoolerError):
    """The client broke the protocol: malformed, oversized or unexpected input."""

    def __init__(self, message: str, sqlstate: str = PROTOCOL_VIOLATION) -> None:
        super().__init__(message, sqlstate, fatal=True, side=Side.CLIENT)


class ServerProtocolError(Exception):
    """The server broke the protocol or sent something the pooler cannot follow."""
