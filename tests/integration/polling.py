"""Waiting for a condition in tests, bounded: poll until true or the timeout passes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pypool.embedded import EmbeddedPostgres


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """Poll `predicate` until it is true (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


@contextmanager
def sampling(probe: Callable[[], int], interval: float = 0.02) -> Iterator[list[int]]:
    """Call `probe` in a thread every `interval` while the block runs; yields the samples
    taken so far (a list that grows), for peaks and counts seen during the block."""
    samples: list[int] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            samples.append(probe())
            time.sleep(interval)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(5)


def settle(postgres: EmbeddedPostgres, pg_activity: Callable[..., int]) -> None:
    """Wait for backends left over from an earlier test's pooler to exit."""
    assert wait_for(lambda: pg_activity(postgres) == 0, 5), "stale server connections"
