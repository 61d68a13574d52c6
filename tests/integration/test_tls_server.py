"""TLS from pypool to PostgreSQL (server_tls_*): a cluster of its own with ssl = on.

The cluster (`tls_postgres`, this module only, so the rest of the suite keeps its plaintext
one) presents a certificate from the test CA for 127.0.0.1 and not for `localhost`, which
tells verify-ca from verify-full. Clients talk plaintext to pypool here; the client side
is test_tls.py.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from pypool.embedded import PG_OS_USER, EmbeddedPostgres
from tests.conftest import ADMIN_PASSWORD, ADMIN_USER, APP_PASSWORD, APP_USER, Pooler

from .tls_ca import Certificates, certs

pytestmark = pytest.mark.timeout(60)
__all__ = ["certs"]

TLS_INFO = re.compile(r"^TLSv1\.[23]/[A-Z0-9_-]+/ECDH=[A-Za-z0-9_-]+$")  # PgBouncer's form


@pytest.fixture(scope="module")
def tls_postgres(certs: Certificates) -> Iterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres()
    try:
        pg.start()
        for source, name in ((certs.postgres.cert, "server.crt"),
                             (certs.postgres.key, "server.key"), (certs.ca.root, "root.crt")):
            target = os.path.join(pg.datadir, name)
            shutil.copyfile(source, target)
            os.chmod(target, 0o600)
            if os.geteuid() == 0:
                user = pwd.getpwnam(PG_OS_USER)
                os.chown(target, user.pw_uid, user.pw_gid)
        # `certdb` takes only a client certificate (PostgreSQL's cert method), over TLS.
        hba = os.path.join(pg.datadir, "pg_hba.conf")
        with open(hba, encoding="utf-8") as f:
            rules = f.read()
        with open(hba, "w", encoding="utf-8") as f:
            f.write("hostssl certdb all 127.0.0.1/32 cert\nhost certdb all 127.0.0.1/32 reject\n"
                    + rules)
        for key, value in (("ssl", "on"), ("ssl_cert_file", "server.crt"),
                           ("ssl_key_file", "server.key"), ("ssl_ca_file", "root.crt")):
            pg.execute(f"ALTER SYSTEM SET {key} = '{value}'")
        pg.execute("SELECT pg_reload_conf()")
        pg.create_role(APP_USER, APP_PASSWORD)
        pg.create_role(ADMIN_USER, ADMIN_PASSWORD, superuser=True)
        pg.execute(f"CREATE DATABASE app OWNER {APP_USER}")
        pg.execute(f"CREATE DATABASE certdb OWNER {APP_USER}")
        yield pg
    finally:
        pg.stop()


def start(pooler: Callable[..., Pooler], pg: EmbeddedPostgres, mode: str,
          host: str = "127.0.0.1", userlist: dict[str, str] | None = None,
          **more: str) -> Pooler:
    server = f"host={host} port={pg.port}"
    return pooler({"server_tls_sslmode": mode, "server_login_retry": "0", **more},
                  databases={"app": f"{server} dbname=app", "certdb": f"{server} dbname=certdb"},
                  userlist=userlist)


def connect(p: Pooler, dbname: str = "app", **params: Any) -> psycopg.Connection:
    return psycopg.connect(p.dsn(dbname), connect_timeout=5, autocommit=True, **params)


def server_tls_column(p: Pooler) -> list[str]:
    with psycopg.connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD), autocommit=True,
                         prepare_threshold=None, connect_timeout=5) as admin:
        cur = admin.execute("SHOW SERVERS")
        names = [c.name for c in cur.description or ()]
        return [dict(zip(names, row, strict=True))["tls"] for row in cur.fetchall()]


def backend_uses_ssl(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("mode", ["allow", "prefer", "require"])
def test_server_connections_use_tls(pooler: Callable[..., Pooler],
                                    tls_postgres: EmbeddedPostgres, mode: str) -> None:
    p = start(pooler, tls_postgres, mode)
    with connect(p) as conn:
        assert backend_uses_ssl(conn)
        [tls] = server_tls_column(p)
        assert TLS_INFO.match(tls), tls


def test_disable_sends_no_ssl_request(pooler: Callable[..., Pooler],
                                      tls_postgres: EmbeddedPostgres) -> None:
    p = start(pooler, tls_postgres, "disable")
    with connect(p) as conn:
        assert not backend_uses_ssl(conn)
        assert server_tls_column(p) == [""]


def test_verify_full_checks_the_host_name(pooler: Callable[..., Pooler], certs: Certificates,
                                          tls_postgres: EmbeddedPostgres) -> None:
    ca = str(certs.ca.root)
    with connect(start(pooler, tls_postgres, "verify-full", server_tls_ca_file=ca)) as conn:
        assert backend_uses_ssl(conn)
    # The certificate is for 127.0.0.1, not for localhost: verify-ca passes, verify-full not.
    with connect(start(pooler, tls_postgres, "verify-ca", "localhost",
                       server_tls_ca_file=ca)) as conn:
        assert backend_uses_ssl(conn)
    p = start(pooler, tls_postgres, "verify-full", "localhost", server_tls_ca_file=ca)
    with pytest.raises(psycopg.OperationalError) as info:
        connect(p)
    assert "server TLS handshake failed: certificate verify failed: Hostname mismatch" in str(
        info.value)
    assert re.search(rf"@localhost:{tls_postgres.port}: server login failed: server TLS "
                     "handshake failed: certificate verify failed", p.log()), p.log()


def test_a_certificate_from_another_ca_is_refused(
        pooler: Callable[..., Pooler], certs: Certificates,
        tls_postgres: EmbeddedPostgres) -> None:
    p = start(pooler, tls_postgres, "verify-ca", server_tls_ca_file=str(certs.other_ca.root))
    with pytest.raises(psycopg.OperationalError) as info:
        connect(p)
    assert "server TLS handshake failed: certificate verify failed: " in str(info.value)
    assert f"@127.0.0.1:{tls_postgres.port}: server login failed" in p.log()


def test_a_server_without_tls(pooler: Callable[..., Pooler],
                              postgres: EmbeddedPostgres) -> None:
    # The suite's own cluster runs without TLS: require refuses it, prefer goes plaintext.
    p = start(pooler, postgres, "require")
    with pytest.raises(psycopg.OperationalError) as info:
        connect(p)
    assert "server refused SSL" in str(info.value)
    assert f"@127.0.0.1:{postgres.port}: server login failed: server refused SSL" in p.log()
    with connect(start(pooler, postgres, "prefer")) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_scram_over_tls_with_only_a_verifier(pooler: Callable[..., Pooler],
                                             tls_postgres: EmbeddedPostgres) -> None:
    # SCRAM-SHA-256-PLUS towards PostgreSQL (it offers it over TLS) from the ClientKey a
    # client's proof gave up: no plaintext password anywhere. A wrong binding would fail.
    verifier = tls_postgres.scram_verifier(APP_USER)
    p = start(pooler, tls_postgres, "require", userlist={APP_USER: verifier,
                                                          ADMIN_USER: ADMIN_PASSWORD})
    with connect(p) as conn:
        assert backend_uses_ssl(conn)
        assert conn.execute("SELECT current_user").fetchone() == (APP_USER,)


def test_client_certificate_towards_the_server(pooler: Callable[..., Pooler],
                                               certs: Certificates,
                                               tls_postgres: EmbeddedPostgres) -> None:
    p = start(pooler, tls_postgres, "verify-full", server_tls_ca_file=str(certs.ca.root),
              server_tls_cert_file=str(certs.client.cert),
              server_tls_key_file=str(certs.client.key))
    with connect(p, "certdb") as conn:
        assert conn.execute("SELECT current_user").fetchone() == (APP_USER,)
    without = start(pooler, tls_postgres, "require")
    with pytest.raises(psycopg.OperationalError, match="connection requires a valid client "
                                                       "certificate"):
        connect(without, "certdb")


def test_changing_server_tls_forgets_the_cached_login_failure(
        pooler: Callable[..., Pooler], postgres: EmbeddedPostgres) -> None:
    # As PgBouncer's test_server_ssl_set_disable: the failure under the old mode must not
    # be served from the cache (server_login_retry) once the mode changed.
    p = start(pooler, postgres, "require", server_login_retry="60")
    with pytest.raises(psycopg.OperationalError, match="server refused SSL"):
        connect(p)
    with pytest.raises(psycopg.OperationalError, match="server login has been failing"):
        connect(p)
    with psycopg.connect(p.dsn("pgbouncer", ADMIN_USER, ADMIN_PASSWORD), autocommit=True,
                         prepare_threshold=None, connect_timeout=5) as admin:
        admin.execute("SET server_tls_sslmode = prefer")
    with connect(p) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_listening_connection_uses_tls_too(pooler: Callable[..., Pooler],
                                               tls_postgres: EmbeddedPostgres) -> None:
    """listen_mode = shared (docs/operating.md): the pool's listening connection logs in
    as its servers do, TLS first."""
    p = start(pooler, tls_postgres, "require")
    with connect(p) as conn, psycopg.connect(
            tls_postgres.dsn("app", APP_USER, APP_PASSWORD), autocommit=True) as sender:
        conn.execute("LISTEN tls_chan")
        ssl_of_listener: list[Any] = []
        for _ in range(100):
            ssl_of_listener = tls_postgres.execute(
                "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
                " WHERE a.application_name = 'pypool listener'") or []
            if ssl_of_listener:
                break
            time.sleep(0.05)
        assert [tuple(row) for row in ssl_of_listener] == [(True,)]
        sender.execute("NOTIFY tls_chan, 'sealed'")
        assert [n.payload for n in conn.notifies(timeout=5, stop_after=1)] == ["sealed"]
