"""The `fake_pooler` fixture: a factory of Poolers over fake sockets (tests/net/fakes.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.net.fakes import fake_pooler_factory


@pytest.fixture
def fake_pooler() -> Iterator[Any]:
    """`fake_pooler(**keys)`: a FakePooler with those [pgbouncer] keys (transaction mode,
    trust, pool_size 1 unless said), closed after the test."""
    yield from fake_pooler_factory()
