"""SET and reloads check values as the ini does: a value the ini would refuse (out of range, a
key pypool does not implement, no TLS mode) is refused with PgBouncer's `SET failed`, or by a
reload that keeps the running configuration, and the pooler goes on serving with the old
value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.admin.console_client import app, console, row, wait_until
from tests.conftest import Pooler

pytestmark = pytest.mark.timeout(60)


def _config(admin: psycopg.Connection[Any], key: str) -> str:
    return str(row(admin, "CONFIG", key=key)["value"])


def test_set_negative_pool_size_is_refused_and_clients_are_served(bouncer: Pooler) -> None:
    # Accepted before, default_pool_size = -1 left every new client waiting for ever.
    with console(bouncer) as admin:
        assert _config(admin, "default_pool_size") == "5"
        with pytest.raises(psycopg.errors.ProtocolViolation) as failure:
            admin.execute("SET default_pool_size = -1")
        assert failure.value.diag.message_primary == "SET failed"
        assert failure.value.diag.severity == "ERROR"
        assert _config(admin, "default_pool_size") == "5"
        with app(bouncer) as client:
            assert client.execute("SELECT 41 + 1").fetchone() == (42,)
    assert "default_pool_size: must be >= 0, not -1; default_pool_size stays '5'" in \
        bouncer.log()


@pytest.mark.parametrize(
    ("command", "key", "reason"),
    [
        ("SET reserve_pool_size = -1", "reserve_pool_size", "must be >= 0"),
        ("SET max_client_conn = 0", "max_client_conn", "must be >= 1"),
        ("SET query_wait_timeout = '-5'", "query_wait_timeout", "must be >= 0"),
        ("SET idle_transaction_timeout = 'soon'", "idle_transaction_timeout",
         "not a duration"),
        ("SET pool_mode = connection", "pool_mode", "must be one of"),
        ("SET auth_type = pam", "auth_type", "not supported yet"),
        ("SET max_prepared_statements = '1.5'", "max_prepared_statements", "not an integer"),
        ("SET client_tls_sslmode = 'verify'", "client_tls_sslmode",
         "must be one of disable, allow, prefer, require, verify-ca, verify-full"),
    ],
)
def test_invalid_set_changes_nothing(operated_pooler: Callable[..., Pooler], command: str,
                                     key: str, reason: str) -> None:
    p = operated_pooler()
    with console(p) as admin:
        before = {r[0]: r[1] for r in admin.execute("SHOW CONFIG").fetchall()}
        with pytest.raises(psycopg.errors.ProtocolViolation, match="^SET failed$"):
            admin.execute(command)
        after = {r[0]: r[1] for r in admin.execute("SHOW CONFIG").fetchall()}
        assert after == before
        with app(p) as client:
            assert client.execute("SELECT 1").fetchone() == (1,)
    assert reason in p.log()
    assert key in p.log()


def test_valid_set_still_applies(bouncer: Pooler) -> None:
    with console(bouncer) as admin:
        assert admin.execute("SET default_pool_size = 0").statusmessage == \
            "SET default_pool_size=0"  # 0 is in range (PgBouncer allows it)
        assert admin.execute("SET default_pool_size = 3").statusmessage == \
            "SET default_pool_size=3"
        assert _config(admin, "default_pool_size") == "3"
        assert row(admin, "DATABASES", name="app")["pool_size"] == 3
        assert admin.execute("SET transaction_timeout = '1min'").statusmessage == \
            "SET transaction_timeout=1min"
        assert _config(admin, "transaction_timeout") == "60"
        # TLS keys at their off value are accepted and change nothing.
        assert admin.execute("SET client_tls_sslmode = disable").statusmessage == \
            "SET client_tls_sslmode=disable"
        with app(bouncer) as client:
            assert client.execute("SELECT 2").fetchone() == (2,)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"client_tls_sslmode": "always"}, "client_tls_sslmode: must be one of"),
        ({"server_tls_protocols": "sslv3"}, "server_tls_protocols: unknown TLS protocol"),
        ({"default_pool_size": "-1"}, "default_pool_size: must be >= 0"),
    ],
)
def test_sighup_with_a_refused_value_keeps_the_running_config(
    operated_pooler: Callable[..., Pooler], override: dict[str, str], named: str
) -> None:
    p = operated_pooler()
    # The same file also changes a valid key: nothing of it is applied.
    p.rewrite_config({"query_wait_timeout": "7", **override})
    p.reload()
    wait_until(lambda: "reload failed, keeping the old configuration" in p.log())
    assert named in p.log()
    assert f"{p.ini_path}:" in p.log()  # the file and line
    with console(p) as admin:
        assert _config(admin, "query_wait_timeout") == "120"
        assert _config(admin, "default_pool_size") == "5"
        # PgBouncer 1.25's answer: an ERROR, F0000 (1.24's RELOAD always answered RELOAD).
        with pytest.raises(psycopg.errors.ConfigFileError,
                           match="RELOAD failed, see logs for additional details"):
            admin.execute("RELOAD")
        with app(p) as client:
            assert client.execute("SELECT 3").fetchone() == (3,)
    assert p.proc.poll() is None


def test_a_tls_set_that_cannot_be_applied_yet_says_so(bouncer: Pooler) -> None:
    """As PgBouncer: TLS keys are set one at a time in any order, so a SET that leaves TLS
    unusable (a mode with no certificate yet) is kept, answered with a NOTICE, and the TLS
    in force (none here) stays: clients still get in without TLS."""
    with console(bouncer) as admin:
        notices: list[str] = []
        admin.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        assert admin.execute("SET client_tls_sslmode = 'require'").statusmessage == \
            "SET client_tls_sslmode=require"
        assert notices == ["TLS settings could not be applied, still using old configuration"]
        assert _config(admin, "client_tls_sslmode") == "require"
        with app(bouncer) as client:
            assert client.execute("SELECT 5").fetchone() == (5,)
            assert client.pgconn.ssl_in_use is False
    assert "client_tls_key_file and client_tls_cert_file must be set" in bouncer.log()
