"""An application's psycopg connection through the pooler, as the integration tests open it:
autocommit, a connect timeout, and no automatic prepared statements (the pooling tests test
pooling alone; the prepared-statement tests turn them on themselves)."""

from __future__ import annotations

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
