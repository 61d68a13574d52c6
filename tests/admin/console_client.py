"""Talking to the admin console from tests: psycopg connections and SHOW as dicts.

psycopg sends the simple Query protocol when a statement has no parameters and is not
prepared, which is all the console speaks: connections here are autocommit (no BEGIN) with
automatic preparation off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from tests.conftest import ADMIN_PASSWORD, ADMIN_USER, APP_PASSWORD, APP_USER, Pooler

STATS_USER, STATS_PASSWORD = "stats_reader", "stats-secret"


def console(p: Pooler, user: str = ADMIN_USER, password: str = ADMIN_PASSWORD,
            dbname: str = "pgbouncer") -> psycopg.Connection[Any]:
    return psycopg.connect(p.dsn(dbname, user, password), autocommit=True,
                           prepare_threshold=None, connect_timeout=5)


def app(p: Pooler, dbname: str = "app", **kwargs: Any) -> psycopg.Connection[Any]:
    """An application client, not preparing statements unless asked (prepare_threshold)."""
    kwargs.setdefault("prepare_threshold", None)
    return psycopg.connect(p.dsn(dbname, APP_USER, APP_PASSWORD), autocommit=True,
                           connect_timeout=5, **kwargs)


def show(conn: psycopg.Connection[Any], what: str) -> list[dict[str, Any]]:
    cur = conn.execute(f"SHOW {what}")
    assert cur.description is not None
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def columns(conn: psycopg.Connection[Any], what: str) -> list[tuple[str, int]]:
    """(name, type OID) of each column of SHOW `what`, in order."""
    cur = conn.execute(f"SHOW {what}")
    assert cur.description is not None
    return [(d.name, d.type_code) for d in cur.description]


def row(conn: psycopg.Connection[Any], what: str, **match: Any) -> dict[str, Any]:
    """The one row of SHOW `what` whose columns have the given values."""
    rows = [r for r in show(conn, what) if all(r[k] == v for k, v in match.items())]
    assert len(rows) == 1, (what, match, rows)
    return rows[0]


def wait_until(condition: Callable[[], Any], timeout: float = 5.0, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)


class Background:
    """Run a function in a thread; `result()` waits for it and re-raises its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 10.0) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value
