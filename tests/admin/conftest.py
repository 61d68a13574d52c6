"""Fixtures for operating pypool: a pooler with a stats user, a short stats_period and, when
asked, a metrics port."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pypool.embedded import EmbeddedPostgres
from tests.admin.console_client import STATS_PASSWORD, STATS_USER
from tests.conftest import ADMIN_PASSWORD, ADMIN_USER, APP_PASSWORD, APP_USER, Pooler


@pytest.fixture
def operated_pooler(pooler: Callable[..., Pooler], postgres: EmbeddedPostgres
                    ) -> Callable[..., Pooler]:
    """`pooler`, plus `stats_reader` in stats_users and the userlist and stats_period = 1 s;
    keyword arguments are ini overrides."""

    def start(**overrides: Any) -> Pooler:
        settings = {"stats_period": "1", "stats_users": STATS_USER}
        settings.update({k: str(v) for k, v in overrides.items()})
        users = {APP_USER: APP_PASSWORD, ADMIN_USER: ADMIN_PASSWORD,
                 postgres.superuser: postgres.password, STATS_USER: STATS_PASSWORD}
        return pooler(settings, userlist=users)

    return start


@pytest.fixture
def bouncer(operated_pooler: Callable[..., Pooler]) -> Pooler:
    """A running pooler as `operated_pooler` starts it, with default_pool_size 5."""
    return operated_pooler()
