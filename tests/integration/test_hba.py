"""`auth_type = hba` against a real pypool and PostgreSQL: auth_hba_file picks each login's
method by connection type, database, user and address; auth_ident_file maps OS users for
`peer`; a reload re-reads both; a bad line is skipped and named in the log."""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import ADMIN_PASSWORD, ADMIN_USER, APP_PASSWORD, APP_USER, Pooler, PoolerFactory
from tests.integration.app_client import connect
from tests.integration.polling import wait_for
from tests.integration.tls_ca import Certificates, certs, tls_settings

pytestmark = pytest.mark.timeout(60)

__all__ = ["certs"]  # the TLS fixture (tests/integration/tls_ca.py)

OS_USER = pwd.getpwuid(os.geteuid()).pw_name


def with_hba(pooler: PoolerFactory, tmp_path: Path, hba: str, ident: str = "") -> Pooler:
    hba_path = tmp_path / "hba.conf"
    hba_path.write_text(hba)
    overrides = {"auth_type": "hba", "auth_hba_file": str(hba_path)}
    if ident:
        ident_path = tmp_path / "ident.conf"
        ident_path.write_text(ident)
        overrides["auth_ident_file"] = str(ident_path)
    return pooler(ini_overrides=overrides)


def tcp(p: Pooler, dbname: str = "app", user: str = APP_USER,
        password: str | None = None) -> psycopg.Connection[Any]:
    extra = {} if password is None else {"password": password}
    return connect("", host=p.host, port=p.port, dbname=dbname, user=user, **extra)


def over_socket(p: Pooler, dbname: str = "app", user: str = APP_USER) -> psycopg.Connection[Any]:
    return connect("", host=p.settings["unix_socket_dir"], port=p.port, dbname=dbname, user=user)


def test_the_first_fitting_line_picks_the_method(pooler: PoolerFactory, tmp_path: Path) -> None:
    p = with_hba(pooler, tmp_path, (
        f"host app {APP_USER} 127.0.0.1/32 trust\n"
        f"host all {ADMIN_USER} 127.0.0.0/8 reject\n"
        "host all all all scram-sha-256\n"
    ))
    with tcp(p) as conn:  # trust: no password asked
        assert conn.execute("SELECT current_user").fetchone() == (APP_USER,)
    # The same user on another database falls through to scram-sha-256.
    with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
        tcp(p, "postgres", APP_USER, "not-the-password")
    with tcp(p, "postgres", APP_USER, APP_PASSWORD) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError, match="login rejected"):
        tcp(p, "app", ADMIN_USER, ADMIN_PASSWORD)


def test_no_fitting_line_refuses_the_login(pooler: PoolerFactory, tmp_path: Path) -> None:
    p = with_hba(pooler, tmp_path, "host app nobody 127.0.0.1/32 trust\n"
                                   "hostssl all all all trust\n")
    # hostssl needs TLS, which this connection is not.
    with pytest.raises(psycopg.OperationalError, match="no authentication method is found"):
        tcp(p, password=APP_PASSWORD)


def test_local_lines_are_the_unix_socket_and_an_ident_map_vouches_for_peer(
    pooler: PoolerFactory, tmp_path: Path
) -> None:
    p = with_hba(
        pooler, tmp_path,
        "local all all peer map=staff\nhost all all all scram-sha-256\n",
        ident=f"staff {OS_USER} {APP_USER}\n",
    )
    # Over the socket: the OS user running the tests may log in as APP_USER, no password.
    with over_socket(p) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (APP_USER,)
    with pytest.raises(psycopg.OperationalError, match="unix socket login rejected"):
        over_socket(p, "app", ADMIN_USER)
    assert "ident map staff cannot be matched" in p.log()
    # Over TCP the local line does not apply: a password is asked for.
    with pytest.raises(psycopg.OperationalError):
        tcp(p)


def test_a_reload_rereads_the_hba_and_ident_files(pooler: PoolerFactory, tmp_path: Path) -> None:
    p = with_hba(pooler, tmp_path, "host all all all reject\n")
    with pytest.raises(psycopg.OperationalError, match="login rejected"):
        tcp(p, password=APP_PASSWORD)
    (tmp_path / "hba.conf").write_text("host all all all trust\n")
    p.reload()

    def trusted() -> bool:
        try:
            with tcp(p):
                return True
        except psycopg.OperationalError:
            return False

    assert wait_for(trusted, timeout=10)


def test_a_bad_line_is_skipped_and_named_in_the_log(pooler: PoolerFactory,
                                                    tmp_path: Path) -> None:
    p = with_hba(pooler, tmp_path, "host all all db.example.com trust\n"
                                   "host all all all trust\n")
    with tcp(p) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    log = p.log()
    assert f"{tmp_path / 'hba.conf'}:1: failed to parse address: db.example.com" in log


def test_a_missing_hba_file_refuses_every_login_and_says_why(
    pooler: PoolerFactory, tmp_path: Path
) -> None:
    p = pooler(ini_overrides={"auth_type": "hba",
                              "auth_hba_file": str(tmp_path / "nowhere.conf")})
    with pytest.raises(psycopg.OperationalError, match="no authentication method is found"):
        tcp(p, password=APP_PASSWORD)
    deadline = time.monotonic() + 5
    while "could not open hba config file" not in p.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "could not open hba config file" in p.log()


def test_hostssl_fits_tls_connections_and_hostnossl_plain_ones(
    pooler: PoolerFactory, tmp_path: Path, certs: Certificates
) -> None:
    hba_path = tmp_path / "hba.conf"
    hba_path.write_text("hostssl all all all trust\nhostnossl all all all reject\n")
    p = pooler(ini_overrides={**tls_settings(certs), "auth_type": "hba",
                              "auth_hba_file": str(hba_path)})
    with connect("", host="localhost", port=p.port, dbname="app", user=APP_USER,
                 sslmode="require") as conn:  # TLS: the hostssl line, trust
        assert conn.pgconn.ssl_in_use
        assert conn.execute("SELECT current_user").fetchone() == (APP_USER,)
    with pytest.raises(psycopg.OperationalError, match="login rejected"):
        connect("", host=p.host, port=p.port, dbname="app", user=APP_USER,
                password=APP_PASSWORD, sslmode="disable")  # plaintext: hostnossl, reject
