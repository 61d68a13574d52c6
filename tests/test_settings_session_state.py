"""The session_state key: global in [pgbouncer], per database in [databases]."""

from __future__ import annotations

from pathlib import Path

import pytest

from pypool.admin.show import config_rows
from pypool.settings import PoolerSettings, SettingsError, load_ini, parse_value

pytestmark = pytest.mark.timeout(10)


def test_default_is_follow() -> None:
    assert PoolerSettings().session_state == "follow"
    assert ("session_state", "follow", "follow", "yes") in config_rows(PoolerSettings())


def test_global_and_per_database(tmp_path: Path) -> None:
    path = tmp_path / "pgbouncer.ini"
    path.write_text("[databases]\napp = host=127.0.0.1 session_state=reject\nother = host=x\n"
                    "[pgbouncer]\nsession_state = ignore\n")
    settings = load_ini(path)
    assert settings.pooler.session_state == "ignore"
    assert settings.databases["app"].session_state == "reject"
    assert settings.databases["other"].session_state is None  # the global value applies
    assert ("session_state", "ignore", "follow", "yes") in config_rows(settings.pooler)


def test_bad_values_name_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="follow, reject, ignore"):
        parse_value("session_state", "pin")
    path = tmp_path / "pgbouncer.ini"
    path.write_text("[databases]\napp = host=127.0.0.1 session_state=maybe\n[pgbouncer]\n")
    with pytest.raises(SettingsError, match="session_state"):
        load_ini(path)
