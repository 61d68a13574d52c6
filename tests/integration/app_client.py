"""An application's psycopg connection through the pooler, as the integration tests open it:
autocommit, a connect timeout, and no automatic prepared statements (the pooling tests test
pooling alone; the prepared-statement tests turn them on themselves)."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

CONNECT_TIMEOUT = 5


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(
        dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, prepare_threshold=None, **kwargs
    )


def assert_pooler_error(exc: psycopg.Error, text: str) -> None:
    """A FATAL 08P01 from the pooler carrying `text` (COMPAT.md: errors the pooler sends)."""
    assert text in str(exc), str(exc)
    assert exc.sqlstate == "08P01", (exc.sqlstate, str(exc))
    assert exc.diag.severity == "FATAL"


class Login(threading.Thread):
    """Connects and runs one statement in a thread (started at once); keeps the row or the
    error, and how long it all took."""

    def __init__(self, dsn: str, sql: str = "SELECT 1") -> None:
        super().__init__(daemon=True)
        self.dsn, self.sql = dsn, sql
        self.result: object = None
        self.error: BaseException | None = None
        self.elapsed = 0.0
        self.start()

    def run(self) -> None:
        started = time.monotonic()
        try:
            with connect(self.dsn) as conn:
                self.result = conn.execute(self.sql).fetchone()
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            self.error = exc
        self.elapsed = time.monotonic() - started
