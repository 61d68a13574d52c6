"""The ini (PgBouncer's format) and URL parsing into Settings."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pypool.settings import (
    ACCEPTED_UNUSED_KEYS,
    NOT_YET_IMPLEMENTED,
    RESTART_ONLY_KEYS,
    TLS_KEYS,
    DatabaseEntry,
    PoolerSettings,
    SettingsError,
    from_url,
    load_ini,
    parse_bool,
    parse_connstring,
    parse_duration,
    parse_value,
    replace_setting,
)

REPO_ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(10)


def write_ini(tmp_path: Path, text: str, name: str = "pgbouncer.ini") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


BASIC = """
[databases]
app = host=10.0.0.5 port=5433 dbname=app_prod pool_size=7
bench = host=127.0.0.1 dbname=bench

[pgbouncer]
listen_addr = 0.0.0.0
listen_port = 6543
auth_type = scram-sha-256
auth_file = userlist.txt
pool_mode = transaction
default_pool_size = 11
max_client_conn = 1000
admin_users = pool_admin, ops
ignore_startup_parameters = extra_float_digits,search_path
query_wait_timeout = 30
server_idle_timeout = 1.5
log_connections = 0
"""


def test_pgbouncer_section(tmp_path: Path) -> None:
    settings = load_ini(write_ini(tmp_path, BASIC))
    p = settings.pooler
    assert p.listen_addr == "0.0.0.0"
    assert p.listen_port == 6543
    assert p.auth_type == "scram-sha-256"
    assert p.pool_mode == "transaction"
    assert p.default_pool_size == 11
    assert p.max_client_conn == 1000
    assert p.admin_users == ("pool_admin", "ops")
    assert p.ignore_startup_parameters == ("extra_float_digits", "search_path")
    assert p.query_wait_timeout == 30.0
    assert p.server_idle_timeout == 1.5
    assert p.log_connections is False
    # A relative auth_file is relative to the ini's folder.
    assert p.auth_file == str(tmp_path / "userlist.txt")
    # Untouched keys keep PgBouncer's defaults.
    assert p.reserve_pool_timeout == 5.0
    assert p.server_lifetime == 3600.0
    assert p.client_login_timeout == 60.0
    assert p.max_prepared_statements == 200
    assert settings.path == str(tmp_path / "pgbouncer.ini")


def test_databases_section(tmp_path: Path) -> None:
    settings = load_ini(write_ini(tmp_path, BASIC))
    app = settings.databases["app"]
    assert app == DatabaseEntry(
        name="app", host="10.0.0.5", port=5433, dbname="app_prod", pool_size=7
    )
    assert app.server_dbname == "app_prod"
    bench = settings.databases["bench"]
    assert bench.port == 5432 and bench.pool_size is None
    assert settings.database("nope") is None


def test_defaults_match_pgbouncer() -> None:
    p = PoolerSettings()
    assert (p.listen_port, p.pool_mode, p.default_pool_size, p.min_pool_size) == (
        6432, "session", 20, 0
    )
    assert (p.reserve_pool_size, p.max_client_conn, p.query_wait_timeout) == (0, 100, 120.0)
    assert (p.server_connect_timeout, p.server_login_retry, p.server_reset_query) == (
        15.0, 15.0, "DISCARD ALL"
    )
    assert p.server_idle_timeout == 600.0
    # PgBouncer 1.25's keys: the queued-client NOTICE after 5 s, no transaction_timeout.
    assert (p.query_wait_notify, p.transaction_timeout) == (5.0, 0.0)
    # 1.25's health check: an empty query (1.24 sent select 1).
    assert p.server_check_query == "<empty>"


def test_pipelining_is_off_by_default() -> None:
    # It gives up query_wait_timeout, the reserve pool and cancel for queued clients: opt-in.
    assert PoolerSettings().pipeline_depth == 0


def test_pgbouncer_125_keys(tmp_path: Path) -> None:
    text = (
        "[pgbouncer]\nquery_wait_notify = 500ms\ntransaction_timeout = 2min\n"
        "[users]\nbatch = transaction_timeout=10 pool_size=2\nweb = pool_mode=session\n"
    )
    settings = load_ini(write_ini(tmp_path, text))
    assert settings.pooler.query_wait_notify == pytest.approx(0.5)
    assert settings.pooler.transaction_timeout == pytest.approx(120.0)
    assert settings.users["batch"].transaction_timeout == pytest.approx(10.0)
    assert settings.users["web"].transaction_timeout is None  # the global value applies


def test_absolute_auth_file_kept(tmp_path: Path) -> None:
    path = write_ini(tmp_path, "[pgbouncer]\nauth_file = /etc/pgbouncer/userlist.txt\n")
    assert load_ini(path).pooler.auth_file == "/etc/pgbouncer/userlist.txt"


def test_pypool_section_is_accepted(tmp_path: Path) -> None:
    path = write_ini(tmp_path, "[pypool]\nlisten_port = 7000\npool_mode = statement\n")
    settings = load_ini(path)
    assert settings.pooler.listen_port == 7000
    assert settings.pooler.pool_mode == "statement"
    assert settings.databases == {}


def test_no_pooler_section(tmp_path: Path) -> None:
    path = write_ini(tmp_path, "[databases]\napp = host=x\n")
    with pytest.raises(SettingsError, match="no \\[pgbouncer\\] or \\[pypool\\] section") as info:
        load_ini(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.ini"
    with pytest.raises(SettingsError, match="cannot read") as info:
        load_ini(path)
    assert str(path) in str(info.value)


def test_broken_ini_syntax(tmp_path: Path) -> None:
    path = write_ini(tmp_path, "[pgbouncer\nlisten_port = 1\n")
    with pytest.raises(SettingsError) as info:
        load_ini(path)
    assert str(path) in str(info.value)


def test_unknown_key_is_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_ini(tmp_path, "[pgbouncer]\nlisten_port = 7001\nfrobnicate_level = 3\n")
    with caplog.at_level(logging.WARNING, logger="pypool.settings"):
        settings = load_ini(path)
    assert settings.pooler.listen_port == 7001
    assert "frobnicate_level" in caplog.text


def test_pgbouncer_keys_pypool_does_not_act_on_are_quiet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # TLS keys too, at values that leave TLS off.
    text = (
        "[pgbouncer]\nauth_hba_file =\nclient_tls_sslmode = disable\n"
        "tcp_keepalive = 1\nserver_tls_sslmode = disable\ndns_max_ttl = 15\n"
        "client_tls_protocols = secure\nserver_tls_ciphers = default\nclient_tls_key_file =\n"
        "client_tls_ecdhcurve = auto\npkt_buf = 4096\n"
    )
    with caplog.at_level(logging.WARNING, logger="pypool.settings"):
        load_ini(write_ini(tmp_path, text))
    assert caplog.text == ""


def test_unix_socket_keys(tmp_path: Path) -> None:
    defaults = PoolerSettings()
    assert (defaults.unix_socket_dir, defaults.unix_socket_mode, defaults.unix_socket_group) \
        == ("/tmp", 0o777, "")
    path = write_ini(tmp_path, "[pgbouncer]\nunix_socket_dir =\nunix_socket_mode = 0700\n"
                     "unix_socket_group = postgres\nauth_type = peer\n")
    cfg = load_ini(path).pooler
    assert (cfg.unix_socket_dir, cfg.unix_socket_mode, cfg.unix_socket_group, cfg.auth_type) \
        == ("", 0o700, "postgres", "peer")
    # As PgBouncer's strtol(base 0): a leading 0 is octal, 0x hexadecimal, else decimal.
    assert [parse_value("unix_socket_mode", t) for t in ("0777", "0", "0x1ff", "511")] \
        == [0o777, 0, 0o777, 511]
    for bad in ("0789", "rwx", "-1", "010000"):
        with pytest.raises(ValueError):
            parse_value("unix_socket_mode", bad)
    for key in ("unix_socket_dir", "unix_socket_mode", "unix_socket_group"):
        assert key in RESTART_ONLY_KEYS and key not in ACCEPTED_UNUSED_KEYS


def test_keys_are_case_insensitive(tmp_path: Path) -> None:
    path = write_ini(tmp_path, "[pgbouncer]\nListen_Port = 7002\nPOOL_MODE = transaction\n")
    settings = load_ini(path)
    assert settings.pooler.listen_port == 7002
    assert settings.pooler.pool_mode == "transaction"


def test_comments(tmp_path: Path) -> None:
    text = "; comment\n[pgbouncer]\n# another\nlisten_port = 7003\n;listen_port = 1\n"
    assert load_ini(write_ini(tmp_path, text)).pooler.listen_port == 7003


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15", 15.0),
        ("0", 0.0),
        ("0.5", 0.5),
        (".25", 0.25),
        ("500ms", 0.5),
        ("250 ms", 0.25),
        ("100us", 1e-4),
        ("3s", 3.0),
        ("2min", 120.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        (" 7 ", 7.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5 minutes", "-1", "1e3", "ms", "5x"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_durations_in_the_ini(tmp_path: Path) -> None:
    text = (
        "[pgbouncer]\nquery_wait_timeout = 500ms\nserver_lifetime = 2min\n"
        "reserve_pool_timeout = 0.2\nidle_transaction_timeout = 1h\n"
    )
    p = load_ini(write_ini(tmp_path, text)).pooler
    assert p.query_wait_timeout == pytest.approx(0.5)
    assert p.server_lifetime == pytest.approx(120.0)
    assert p.reserve_pool_timeout == pytest.approx(0.2)
    assert p.idle_transaction_timeout == pytest.approx(3600.0)


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", True), ("yes", True), ("On", True), ("true", True),
     ("0", False), ("no", False), ("OFF", False), ("false", False)],
)
def test_booleans(text: str, value: bool) -> None:
    assert parse_bool(text) is value


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("listen_port", "sixty"),
        ("default_pool_size", "1.5"),
        ("query_wait_timeout", "soon"),
        ("log_connections", "maybe"),
        ("pool_mode", "connection"),
        ("auth_type", "kerberos"),
        ("auth_type", "pam"),
    ],
)
def test_bad_values_name_the_file_and_key(tmp_path: Path, key: str, value: str) -> None:
    path = write_ini(tmp_path, f"[pgbouncer]\n{key} = {value}\n")
    with pytest.raises(SettingsError) as info:
        load_ini(path)
    message = str(info.value)
    assert str(path) in message
    assert key in message


def test_connstring_quoting() -> None:
    assert parse_connstring("host=db port=5433") == {"host": "db", "port": "5433"}
    assert parse_connstring("application_name='my app' dbname = x") == {
        "application_name": "my app",
        "dbname": "x",
    }
    assert parse_connstring(r"password='it''s \'quoted\' \\ ok'") == {
        "password": "it's 'quoted' \\ ok"
    }
    assert parse_connstring("password=''") == {"password": ""}
    assert parse_connstring("  HOST=db  ") == {"host": "db"}
    assert parse_connstring("") == {}


@pytest.mark.parametrize("text", ["host", "password='unterminated", "host=db junk"])
def test_bad_connstrings(text: str) -> None:
    with pytest.raises(ValueError):
        parse_connstring(text)


def test_database_entry_with_quotes_and_options(tmp_path: Path) -> None:
    text = (
        "[databases]\n"
        "app = host=127.0.0.1 dbname=app user=app password='p w''d' "
        "application_name='my app' pool_mode=session max_db_connections=9 "
        "reserve_pool_size=2 min_pool_size=1 auth_user=pool_admin timezone=UTC\n"
        "[pgbouncer]\n"
    )
    entry = load_ini(write_ini(tmp_path, text)).databases["app"]
    assert entry.password == "p w'd"
    assert entry.application_name == "my app"
    assert entry.pool_mode == "session"
    assert (entry.max_db_connections, entry.reserve_pool_size, entry.min_pool_size) == (9, 2, 1)
    assert (entry.user, entry.auth_user, entry.timezone) == ("app", "pool_admin", "UTC")


def test_database_entry_unknown_key_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = "[databases]\napp = host=127.0.0.1 sslmode=require\n[pgbouncer]\n"
    with caplog.at_level(logging.WARNING, logger="pypool.settings"):
        entry = load_ini(write_ini(tmp_path, text)).databases["app"]
    assert entry.host == "127.0.0.1"
    assert "sslmode" in caplog.text


@pytest.mark.parametrize(
    ("connstr", "key"),
    [
        ("host=x port=abc", "port"),
        ("host=x pool_size=many", "pool_size"),
        ("host=x pool_mode=connection", "pool_mode"),
        ("host=x password='open", "app"),
    ],
)
def test_bad_database_entries_name_the_file_and_key(
    tmp_path: Path, connstr: str, key: str
) -> None:
    path = write_ini(tmp_path, f"[databases]\napp = {connstr}\n[pgbouncer]\n")
    with pytest.raises(SettingsError) as info:
        load_ini(path)
    assert str(path) in str(info.value)
    assert key in str(info.value)


def test_star_fallback(tmp_path: Path) -> None:
    text = "[databases]\napp = host=10.0.0.1\n* = host=10.0.0.2 port=6000\n[pgbouncer]\n"
    settings = load_ini(write_ini(tmp_path, text))
    assert settings.database("app") is not None
    assert settings.database("app").host == "10.0.0.1"  # type: ignore[union-attr]
    other = settings.database("reports")
    assert other is not None
    assert (other.name, other.host, other.port) == ("reports", "10.0.0.2", 6000)
    # Without dbname, the server database is the name the client asked for.
    assert other.server_dbname == "reports"


def test_unix_socket_host_falls_back_to_tcp(tmp_path: Path) -> None:
    text = "[databases]\napp = host=/var/run/postgresql\n[pgbouncer]\n"
    assert load_ini(write_ini(tmp_path, text)).databases["app"].host == "127.0.0.1"


def test_users_section(tmp_path: Path) -> None:
    text = (
        "[databases]\n[pgbouncer]\n[users]\n"
        "reporting = pool_mode=session max_user_connections=3 pool_size=4\n"
    )
    user = load_ini(write_ini(tmp_path, text)).users["reporting"]
    assert (user.pool_mode, user.max_user_connections, user.pool_size) == ("session", 3, 4)


def test_from_url() -> None:
    settings = from_url("postgresql://app:s%40cret@db.example:5433/appdb", listen_port=7010)
    entry = settings.databases["appdb"]
    assert (entry.host, entry.port, entry.dbname) == ("db.example", 5433, "appdb")
    p = settings.pooler
    assert p.listen_port == 7010
    assert p.pool_mode == "transaction"
    assert p.auth_type == "scram-sha-256"
    assert p.admin_users == ("app",)
    assert settings.inline_users == {"app": "s@cret"}


def test_from_url_defaults() -> None:
    settings = from_url("postgres://bob@localhost")
    assert list(settings.databases) == ["bob"]  # dbname defaults to the user
    assert settings.databases["bob"].port == 5432
    assert settings.pooler.auth_type == "trust"  # no password: nothing to check
    assert settings.inline_users == {"bob": ""}  # trust lets in known users only: this one


@pytest.mark.parametrize("url", ["mysql://x@y/z", "http://x", "just-a-string"])
def test_from_url_rejects_other_schemes(url: str) -> None:
    with pytest.raises(SettingsError):
        from_url(url)


def test_from_url_takes_the_libpq_parameters_that_have_an_ini_key() -> None:
    settings = from_url("postgresql://app:pw@db1,db2:5433/appdb?sslmode=require"
                        "&sslrootcert=/ca.pem&connect_timeout=3&application_name=web"
                        "&load_balance_hosts=disable")
    entry = settings.databases["appdb"]
    assert (entry.host, entry.port, entry.hosts) == ("db1,db2", 5433, ("db1", "db2"))
    assert (entry.application_name, entry.load_balance_hosts) == ("web", "disable")
    p = settings.pooler
    assert (p.server_tls_sslmode, p.server_tls_ca_file) == ("require", "/ca.pem")
    assert p.server_connect_timeout == 3.0
    ipv6 = from_url("postgresql://app@[::1]:6000/appdb").databases["appdb"]
    assert (ipv6.host, ipv6.port) == ("::1", 6000)


@pytest.mark.parametrize(("url", "why"), [
    ("postgresql://app:pw@db:99999/appdb", "invalid port '99999'"),
    ("postgresql://app:pw@db:x/appdb", "invalid port 'x'"),
    ("postgresql://app:pw@db1:5432,db2:5433/appdb", "several hosts with different ports"),
    ("postgresql://app:pw@db/appdb?sslmode=bogus", "server_tls_sslmode: must be one of"),
    ("postgresql://app:pw@db/appdb?target_session_attrs=any",
     "URL parameter 'target_session_attrs' is not taken"),
    ("postgresql://app:pw@db/appdb?connect_timeout=soon", "server_connect_timeout"),
])
def test_from_url_refuses_what_it_cannot_honour_by_name(url: str, why: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(why)):
        from_url(url)


# --- one parser and checker for the ini and SET -------------------------------------------------

# (key, value) pairs that parse but would break the pooler, and what the refusal says.
OUT_OF_RANGE = [
    ("default_pool_size", "-1", ">= 0"),
    ("min_pool_size", "-2", ">= 0"),
    ("reserve_pool_size", "-1", ">= 0"),
    ("max_db_connections", "-5", ">= 0"),
    ("max_user_connections", "-1", ">= 0"),
    ("max_prepared_statements", "-1", ">= 0"),
    ("pipeline_depth", "-1", ">= 0"),
    ("max_client_conn", "0", ">= 1"),
    ("scram_iterations", "0", ">= 1"),
    ("listen_port", "0", "between 1 and 65535"),
    ("listen_port", "65536", "between 1 and 65535"),
    ("metrics_port", "70000", "between 0 and 65535"),
    ("workers", "0", "between 1 and 256"),
    ("query_wait_timeout", "-1", ">= 0"),
    ("transaction_timeout", "-10", ">= 0"),
    ("query_wait_notify", "-1s", ">= 0"),
    ("pool_mode", "connection", "one of session, transaction, statement"),
    ("max_packet_size", "4294967295", "<= 2147483647"),  # too big, not too small
    ("max_packet_size", "1023", ">= 1024"),
    ("default_pool_size", "2147483648", "<= 2147483647"),
]


@pytest.mark.parametrize(("key", "value", "why"), OUT_OF_RANGE)
def test_out_of_range_values_name_the_file_line_and_key(
    tmp_path: Path, key: str, value: str, why: str
) -> None:
    path = write_ini(tmp_path, f"[databases]\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
                               f"{key} = {value}\n")
    with pytest.raises(SettingsError) as info:
        load_ini(path)
    assert str(info.value).startswith(f"{path}:5 [pgbouncer]: {key}: must be {why}")


@pytest.mark.parametrize(
    ("key", "value", "why"), [case for case in OUT_OF_RANGE if case[0] not in RESTART_ONLY_KEYS]
)
def test_set_refuses_what_the_ini_refuses(key: str, value: str, why: str) -> None:
    running = PoolerSettings(default_pool_size=7)
    with pytest.raises(SettingsError, match=f"{key}: must be {re.escape(why)}"):
        replace_setting(running, key, value)
    assert running.default_pool_size == 7  # frozen: nothing half-applied


def test_set_accepts_what_the_ini_accepts() -> None:
    running = PoolerSettings()
    changed = replace_setting(running, "default_pool_size", "0")
    assert changed.default_pool_size == 0
    assert replace_setting(running, "query_wait_timeout", "500ms").query_wait_timeout == 0.5
    assert replace_setting(running, "Transaction_Timeout", " 10 ").transaction_timeout == 10.0
    assert replace_setting(running, "pool_mode", "statement").pool_mode == "statement"
    assert dataclasses.replace(changed, default_pool_size=20) == running
    for key, value in (("default_pool_size", "many"), ("no_such_key", "1"),
                       ("listen_port", "7000"), ("log_connections", "maybe")):
        with pytest.raises(SettingsError):
            replace_setting(running, key, value)


def test_the_line_is_the_one_in_force(tmp_path: Path) -> None:
    # configparser keeps the last of a repeated key, so the error points at that one.
    text = "[pgbouncer]\n; a comment\ndefault_pool_size = 5\n\nDefault_Pool_Size = -1\n"
    with pytest.raises(SettingsError, match=r":5 \[pgbouncer\]: default_pool_size:"):
        load_ini(write_ini(tmp_path, text))


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("app = host=x port=0", "port"),
        ("app = host=x port=65536", "port"),
        ("app = host=x pool_size=-1", "pool_size"),
        ("app = host=x reserve_pool_size=-1", "reserve_pool_size"),
        ("app = host=x max_db_connections=-1", "max_db_connections"),
    ],
)
def test_database_entry_ranges(tmp_path: Path, line: str, key: str) -> None:
    path = write_ini(tmp_path, f"[pgbouncer]\n[databases]\nother = host=y\n{line}\n")
    with pytest.raises(SettingsError) as info:
        load_ini(path)
    assert str(info.value).startswith(f"{path}:4 [databases]: database 'app': {key}: ")


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ("pool_size=-1", "pool_size"),
        ("pool_size=many", "pool_size"),
        ("max_user_connections=-3", "max_user_connections"),
        ("pool_mode=connection", "pool_mode"),
        ("transaction_timeout=soon", "transaction_timeout"),
        ("transaction_timeout=-1", "transaction_timeout"),
        ("pool_size='open", "batch"),
    ],
)
def test_bad_user_entries_name_the_file_line_and_key(
    tmp_path: Path, entry: str, key: str
) -> None:
    # Before, a bad integer here escaped as a bare ValueError (a traceback at start).
    path = write_ini(tmp_path, f"[pgbouncer]\n[users]\nbatch = {entry}\n")
    with pytest.raises(SettingsError) as info:
        load_ini(path)
    assert str(info.value).startswith(f"{path}:3 [users]: user 'batch': ")
    assert key in str(info.value)


# --- keys pypool does not implement ------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("client_tls_sslmode", "require", "require"),
        ("client_tls_sslmode", "Verify-Full", "verify-full"),
        ("server_tls_sslmode", "verify-ca", "verify-ca"),
        ("client_tls_key_file", "/etc/pgbouncer/server.key", "/etc/pgbouncer/server.key"),
        ("server_tls_ca_file", "/etc/ssl/root.crt", "/etc/ssl/root.crt"),
        ("client_tls_ciphers", "HIGH:!aNULL", "HIGH:!aNULL"),
        ("client_tls_protocols", "tlsv1.2,tlsv1.3", "tlsv1.2,tlsv1.3"),
        ("server_tls_protocols", "all:!tlsv1.0", "all:!tlsv1.0"),
    ],
)
def test_tls_keys_are_read(tmp_path: Path, key: str, value: str, expected: str) -> None:
    path = write_ini(tmp_path, f"[pgbouncer]\nlisten_port = 7000\n{key} = {value}\n")
    assert getattr(load_ini(path).pooler, key) == expected
    assert getattr(replace_setting(PoolerSettings(), key, value), key) == expected


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("client_tls_sslmode", "verify", "must be one of disable, allow, prefer, require"),
        ("server_tls_sslmode", "", "must be one of"),
        ("client_tls_protocols", "tlsv1.4", "unknown TLS protocol 'tlsv1.4'"),
    ],
)
def test_bad_tls_values_are_refused_naming_the_key(tmp_path: Path, key: str, value: str,
                                                   reason: str) -> None:
    path = write_ini(tmp_path, f"[pgbouncer]\nlisten_port = 7000\n{key} = {value}\n")
    with pytest.raises(SettingsError) as info:
        load_ini(path)
    assert str(info.value).startswith(f"{path}:3 [pgbouncer]: {key}: ")
    assert reason in str(info.value)
    with pytest.raises(SettingsError, match=key):
        replace_setting(PoolerSettings(), key, value)


def test_every_tls_key_accepts_its_default(tmp_path: Path) -> None:
    defaults = PoolerSettings()
    text = "[pgbouncer]\n" + "".join(f"{key} = {getattr(defaults, key)}\n" for key in TLS_KEYS)
    assert load_ini(write_ini(tmp_path, text)).pooler == defaults


def test_unimplemented_keys_only_at_their_default(tmp_path: Path) -> None:
    assert "disable_pqexec" in NOT_YET_IMPLEMENTED
    path = write_ini(tmp_path, "[pgbouncer]\ndisable_pqexec = 1\n")
    with pytest.raises(SettingsError) as info:
        load_ini(path)
    assert str(info.value).startswith(
        f"{path}:2 [pgbouncer]: key disable_pqexec is not supported yet")
    assert load_ini(write_ini(tmp_path, "[pgbouncer]\ndisable_pqexec = 0\n")).pooler


@pytest.mark.parametrize("value", ["75", "4096", "65536"])
def test_pkt_buf_is_accepted_at_any_size(tmp_path: Path, value: str,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """A buffer size in PgBouncer, not a limit (its own suite runs with 75): any positive
    value loads, and one other than the default is logged as having no effect."""
    with caplog.at_level(logging.WARNING, logger="pypool"):
        got = load_ini(write_ini(tmp_path, f"[pgbouncer]\npkt_buf = {value}\n"))
    assert got.pooler.pkt_buf == int(value)
    assert ("pkt_buf = " + value + " has no effect in pypool" in caplog.text) is (
        value != "4096")


def test_keys_being_implemented_are_accepted(tmp_path: Path) -> None:
    text = (
        "[databases]\napp = host=x connect_query='SET search_path = app'\n"
        "[pgbouncer]\nserver_check_query = select 2\nserver_check_delay = 10\n"
        "server_reset_query_always = 1\napplication_name_add_host = 1\n"
        "shutdown_timeout = 30\nquery_wait_notify = 0\ntransaction_timeout = 60\n"
    )
    settings = load_ini(write_ini(tmp_path, text))
    p = settings.pooler
    assert (p.server_check_query, p.server_check_delay, p.server_reset_query_always) == (
        "select 2", 10.0, True)
    assert (p.application_name_add_host, p.shutdown_timeout) == (True, 30.0)
    assert (p.query_wait_notify, p.transaction_timeout) == (0.0, 60.0)
    assert settings.databases["app"].connect_query == "SET search_path = app"


def test_start_with_unusable_tls_exits_saying_why(tmp_path: Path) -> None:
    # The operator asked for TLS and it cannot be set up: pypool does not start in plaintext.
    path = write_ini(tmp_path, "[databases]\napp = host=127.0.0.1\n[pgbouncer]\n"
                               "listen_port = 1\nclient_tls_sslmode = require\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "pypool", str(path)], capture_output=True,
                          text=True, timeout=20, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode != 0
    assert ("To allow TLS connections from clients, client_tls_key_file and "
            "client_tls_cert_file must be set.") in done.stderr


# --- the example configuration ---------------------------------------------------------------


def test_example_ini_lists_every_key_with_its_default() -> None:
    """config/pypool.ini lists every [pgbouncer] key, at its default unless marked CHANGED."""
    example = REPO_ROOT / "config" / "pypool.ini"
    settings = load_ini(example).pooler
    text = example.read_text()
    defaults = PoolerSettings()
    for f in dataclasses.fields(PoolerSettings):
        match = re.search(rf"^(;; CHANGED.*\n)?{f.name} =", text, re.MULTILINE)
        assert match, f"{f.name} is not in config/pypool.ini"
        if not match.group(1):
            assert getattr(settings, f.name) == getattr(defaults, f.name), f.name


def test_scram_iterations_defaults_to_4096_and_is_read(tmp_path: Path) -> None:
    assert PoolerSettings().scram_iterations == 4096
    path = write_ini(tmp_path, "[databases]\n\n[pgbouncer]\nscram_iterations = 10000\n")
    assert load_ini(path).pooler.scram_iterations == 10000


def test_a_key_with_no_effect_set_away_from_its_default_is_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_ini(tmp_path, "[databases]\n[pgbouncer]\ndns_max_ttl = 60\nsbuf_loopcnt = 5\n")
    with caplog.at_level(logging.WARNING):
        settings = load_ini(path)
    assert settings.pooler.dns_max_ttl == 60
    assert "dns_max_ttl = 60 has no effect in pypool: no DNS cache" in caplog.text
    assert "sbuf_loopcnt" not in caplog.text  # its default: nothing to say
