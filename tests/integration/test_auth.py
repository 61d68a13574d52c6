"""Client authentication through the pooler, and the pooler's own login to PostgreSQL.

Each auth_type with a real client; failures checked on a raw socket, where the exact
ErrorResponse can be compared: an unknown user must be indistinguishable from a wrong
password, and an unknown database is only named after a correct password."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import pytest
from scramp import ScramClient

from pypool.auth.md5 import md5_hash, md5_response_from_secret
from pypool.protocol import messages as m

from .polling import wait_for
from .rawclient import RawClient

pytestmark = pytest.mark.timeout(60)

APP, APP_PW = "app", "app-secret"
ADMIN, ADMIN_PW = "pool_admin", "admin-secret"


def query_as(p, user: str = APP, password: str = APP_PW, dbname: str = "app") -> str:  # type: ignore[no-untyped-def]
    with psycopg.connect(p.dsn(dbname, user, password), connect_timeout=5,
                         autocommit=True) as conn:
        row = conn.execute("SELECT current_user || '@' || current_database()").fetchone()
        assert row is not None
        return str(row[0])


@dataclass
class RawLogin:
    method: int = -1  # the authentication request the pooler chose
    salt: str = ""  # SCRAM: the salt in server-first
    iterations: str = ""
    error: dict[str, str] | None = None
    error_bytes: bytes = b""
    kinds: list[str] = field(default_factory=list)  # message types after the exchange


def raw_login(p, user: str, password: str, database: str = "app") -> RawLogin:  # type: ignore[no-untyped-def]
    """Answer whatever the pooler asks (SCRAM, md5, cleartext) with `password`, on a raw
    socket, and record what came back up to ReadyForQuery or the connection's end."""
    result = RawLogin()
    with RawClient(p.host, p.port) as raw:
        raw.send_startup({"user": user, "database": database})
        scram: ScramClient | None = None
        while True:
            msg = raw.read_message()
            if msg is None:
                return result
            kind, body = msg
            if kind == m.ERROR_RESPONSE:
                result.error = m.parse_error_fields(body)
                result.error_bytes = body
                assert raw.read_message() is None, "a FATAL error must close the connection"
                return result
            if kind != m.AUTHENTICATION:
                result.kinds.append(chr(kind))
                if kind == m.READY_FOR_QUERY:
                    return result
                continue
            code, payload = m.parse_authentication(body)
            if code == m.AUTH_OK:
                result.kinds.append("R0")
            elif code == m.AUTH_SASL:
                result.method = code
                assert "SCRAM-SHA-256" in m.parse_sasl_mechanisms(payload)
                scram = ScramClient(["SCRAM-SHA-256"], user, password)
                # scramp names the user (`n=app`); libpq's empty `n=` is psycopg's path.
                first = scram.get_client_first()
                raw.send(m.sasl_initial_response("SCRAM-SHA-256", first.encode()))
            elif code == m.AUTH_SASL_CONTINUE:
                assert scram is not None
                text = payload.decode()
                attrs = dict(part.split("=", 1) for part in text.split(","))
                result.salt, result.iterations = attrs["s"], attrs["i"]
                scram.set_server_first(text)
                raw.send(m.password_message(scram.get_client_final().encode()))
            elif code == m.AUTH_SASL_FINAL:
                assert scram is not None
                scram.set_server_final(payload.decode())  # the pooler proved it knows the key
            elif code == m.AUTH_MD5_PASSWORD:
                result.method = code
                response = md5_response_from_secret(password, user, payload[:4])
                raw.send(m.password_message(m.cstring(response)))
            elif code == m.AUTH_CLEARTEXT_PASSWORD:
                result.method = code
                raw.send(m.password_message(m.cstring(password)))
            else:
                pytest.fail(f"unexpected authentication request {code}")


# --- each auth_type works -----------------------------------------------------------------


def test_scram_with_plaintext_secret(pooler: Callable) -> None:
    p = pooler()  # auth_type = scram-sha-256, userlist with plaintext passwords
    assert query_as(p) == "app@app"
    login = raw_login(p, APP, APP_PW)
    assert login.method == m.AUTH_SASL
    assert login.error is None
    assert login.kinds[0] == "R0" and login.kinds[-1] == "Z"
    assert "K" in login.kinds and "S" in login.kinds


def test_scram_with_verifier_logs_into_postgres_with_the_recovered_client_key(
    pooler: Callable, postgres, pg_activity: Callable  # type: ignore[no-untyped-def]
) -> None:
    verifier = postgres.scram_verifier(APP)
    assert verifier.startswith("SCRAM-SHA-256$")
    p = pooler(userlist={APP: verifier, ADMIN: ADMIN_PW})
    before = pg_activity(postgres, "app", "app")
    assert query_as(p) == "app@app"
    # A second client, while the first holds its server in a transaction: a second server
    # login, again with the ClientKey (there is no password anywhere).
    with psycopg.connect(p.dsn(), connect_timeout=5) as first:
        first.execute("SELECT 1")  # BEGIN ... holds a server
        assert query_as(p) == "app@app"
        assert pg_activity(postgres, "app", "app") - before >= 2
        first.rollback()
    assert "cannot do SCRAM" not in p.log()


def test_scram_verifier_and_wrong_password(pooler: Callable, postgres) -> None:  # type: ignore[no-untyped-def]
    p = pooler(userlist={APP: postgres.scram_verifier(APP)})
    login = raw_login(p, APP, "wrong")
    assert login.error is not None
    assert (login.error["S"], login.error["C"]) == ("FATAL", "28P01")
    assert login.error["M"] == "SASL authentication failed"
    assert query_as(p) == "app@app"


def test_md5_client_auth(pooler: Callable) -> None:
    p = pooler({"auth_type": "md5"})  # plaintext userlist: the pooler logs in with SCRAM
    assert query_as(p) == "app@app"
    login = raw_login(p, APP, APP_PW)
    assert login.method == m.AUTH_MD5_PASSWORD
    assert login.error is None and login.kinds[-1] == "Z"


def test_md5_hash_in_userlist_with_server_password_in_the_database_entry(
    pooler: Callable, postgres  # type: ignore[no-untyped-def]
) -> None:
    # The md5 hash checks the client; PostgreSQL wants SCRAM, so the server login needs the
    # password from [databases].
    server = f"host={postgres.host} port={postgres.port}"
    p = pooler(
        {"auth_type": "md5"},
        databases={"app": f"{server} dbname=app password={APP_PW}"},
        userlist={APP: md5_hash(APP_PW, APP)},
    )
    assert query_as(p) == "app@app"
    login = raw_login(p, APP, "wrong")
    assert login.error is not None and login.error["C"] == "28P01"


def test_plain_client_auth(pooler: Callable) -> None:
    p = pooler({"auth_type": "plain"})
    assert query_as(p) == "app@app"
    login = raw_login(p, APP, APP_PW)
    assert login.method == m.AUTH_CLEARTEXT_PASSWORD
    assert login.error is None
    login = raw_login(p, APP, "wrong")
    assert login.error is not None
    assert login.error["M"] == "password authentication failed"


def test_trust_takes_any_password(pooler: Callable) -> None:
    p = pooler({"auth_type": "trust"})
    assert query_as(p, password="not-the-password") == "app@app"
    login = raw_login(p, APP, "whatever")
    assert login.method == -1  # no password was asked for
    assert login.error is None and login.kinds[0] == "R0"


def test_scram_iterations_sets_the_count_of_a_plaintext_secrets_verifier(
    pooler: Callable, postgres  # type: ignore[no-untyped-def]
) -> None:
    # 8192 for scramp's client here (it refuses fewer than 4096); libpq takes any count.
    p = pooler({"scram_iterations": "8192"})
    login = raw_login(p, APP, APP_PW)
    assert login.iterations == "8192" and login.error is None and login.kinds[-1] == "Z"
    assert raw_login(p, "ghost_user", "x").iterations == "8192"  # the mock one too
    with psycopg.connect(p.dsn("pgbouncer", ADMIN, ADMIN_PW), autocommit=True) as admin:
        rows = {r[0]: r[1:] for r in admin.execute("SHOW CONFIG").fetchall()}
    assert rows["scram_iterations"] == ("8192", "4096", "yes")
    # A stored verifier keeps its own count.
    p2 = pooler({"scram_iterations": "8192"}, userlist={APP: postgres.scram_verifier(APP)})
    assert raw_login(p2, APP, APP_PW).iterations == "4096"
    p3 = pooler({"scram_iterations": "100"})
    assert query_as(p3) == "app@app"  # libpq, 100 iterations


@pytest.mark.parametrize("secret", ["plaintext", "verifier"])
def test_a_changed_password_in_the_auth_file_replaces_the_cached_one(
    pooler: Callable, postgres, secret: str  # type: ignore[no-untyped-def]
) -> None:
    """Logins reuse a secret's parsed or derived verifier; after a password change (in
    PostgreSQL and in the auth_file) and a reload, the new password must get in and the old
    one must not."""
    user = f"rotating_{secret}"
    postgres.execute(f"DROP ROLE IF EXISTS {user}")
    postgres.create_role(user, "old-secret")

    def entry(password: str) -> str:
        return password if secret == "plaintext" else postgres.scram_verifier(user)

    p = pooler(userlist={user: entry("old-secret"), ADMIN: ADMIN_PW})
    try:
        assert query_as(p, user, "old-secret") == f"{user}@app"
        assert raw_login(p, user, "old-secret").error is None
        postgres.execute(f"ALTER ROLE {user} PASSWORD 'new-secret'")
        p.rewrite_config(userlist={user: entry("new-secret"), ADMIN: ADMIN_PW})
        p.reload()
        assert wait_for(lambda: raw_login(p, user, "old-secret").error is not None, timeout=10)
        old = raw_login(p, user, "old-secret")
        assert old.error is not None and old.error["C"] == "28P01"
        assert raw_login(p, user, "new-secret").error is None
        assert query_as(p, user, "new-secret") == f"{user}@app"
    finally:
        p.stop()
        postgres.execute(f"DROP ROLE IF EXISTS {user}")


# --- failures -----------------------------------------------------------------------------


def test_wrong_password_scram(pooler: Callable) -> None:
    p = pooler()
    login = raw_login(p, APP, "wrong")
    assert login.error is not None
    assert (login.error["S"], login.error["C"], login.error["M"]) == (
        "FATAL", "28P01", "SASL authentication failed"
    )
    with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
        query_as(p, password="wrong")


def test_wrong_password_md5(pooler: Callable) -> None:
    p = pooler({"auth_type": "md5"})
    login = raw_login(p, APP, "wrong")
    assert login.error is not None
    assert (login.error["S"], login.error["C"], login.error["M"]) == (
        "FATAL", "28P01", "password authentication failed"
    )
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        query_as(p, password="wrong")


@pytest.mark.parametrize("auth_type", ["scram-sha-256", "md5", "plain"])
def test_unknown_user_fails_exactly_like_a_wrong_password(
    pooler: Callable, auth_type: str
) -> None:
    p = pooler({"auth_type": auth_type})
    wrong = raw_login(p, APP, "wrong")
    ghost = raw_login(p, "ghost_user", "wrong")
    assert wrong.error is not None and ghost.error is not None
    assert ghost.method == wrong.method
    assert ghost.error_bytes == wrong.error_bytes  # byte for byte the same ErrorResponse
    assert ghost.iterations == wrong.iterations
    assert len(base64.b64decode(ghost.salt)) == len(base64.b64decode(wrong.salt))


def test_scram_salt_is_stable_for_known_and_unknown_users(
    pooler: Callable, postgres  # type: ignore[no-untyped-def]
) -> None:
    # A salt that changes between attempts would reveal that a name is unknown.
    p = pooler(userlist={APP: postgres.scram_verifier(APP), ADMIN: ADMIN_PW})
    for user in (APP, ADMIN, "ghost_user"):
        salts = {raw_login(p, user, "wrong").salt for _ in range(2)}
        assert len(salts) == 1, (user, salts)
    assert raw_login(p, "ghost_user", "x").salt != raw_login(p, "other_ghost", "x").salt


def test_unknown_database_is_named_only_after_the_password(pooler: Callable) -> None:
    p = pooler()
    ok = raw_login(p, APP, APP_PW, database="nope_db")
    assert ok.method == m.AUTH_SASL  # the password was asked for first
    assert ok.error is not None
    assert ok.error["S"] == "FATAL"
    assert ok.error["M"] == "no such database: nope_db"
    bad = raw_login(p, APP, "wrong", database="nope_db")
    assert bad.error is not None
    assert bad.error["M"] == "SASL authentication failed"
    with pytest.raises(psycopg.OperationalError, match="no such database: nope_db"):
        query_as(p, dbname="nope_db")


def test_unknown_database_with_trust(pooler: Callable) -> None:
    p = pooler({"auth_type": "trust"})
    with pytest.raises(psycopg.OperationalError, match="no such database: nope_db"):
        query_as(p, dbname="nope_db")


# --- auth_query ---------------------------------------------------------------------------


def test_auth_query_with_auth_user(
    pooler: Callable, postgres, pg_activity: Callable  # type: ignore[no-untyped-def]
) -> None:
    """Only the auth_user is in the userlist; app's verifier comes from pg_authid, and the
    pooler logs in as app with the ClientKey from app's own proof."""
    p = pooler({"auth_user": ADMIN}, userlist={ADMIN: ADMIN_PW})
    assert query_as(p) == "app@app"
    assert query_as(p, dbname="bench") == "app@bench"
    login = raw_login(p, APP, "wrong")
    assert login.error is not None
    assert (login.error["C"], login.error["M"]) == ("28P01", "SASL authentication failed")
    ghost = raw_login(p, "no_such_role", "wrong")
    assert ghost.error_bytes == login.error_bytes
    # The auth_user itself logs in from the userlist.
    assert query_as(p, ADMIN, ADMIN_PW, "postgres") == "pool_admin@postgres"
    assert pg_activity(postgres, "app", "app") >= 1


def test_auth_query_on_the_database_entry(pooler: Callable, postgres) -> None:  # type: ignore[no-untyped-def]
    server = f"host={postgres.host} port={postgres.port}"
    p = pooler(
        databases={"app": f"{server} dbname=app auth_user={ADMIN}"},
        userlist={ADMIN: ADMIN_PW},
    )
    assert query_as(p) == "app@app"
    with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
        query_as(p, password="wrong")


def test_md5_auth_type_with_a_verifier_uses_scram(pooler: Callable, postgres) -> None:  # type: ignore[no-untyped-def]
    # As PostgreSQL: auth_type md5 with a SCRAM secret asks for SCRAM.
    p = pooler({"auth_type": "md5"}, userlist={APP: postgres.scram_verifier(APP)})
    login = raw_login(p, APP, APP_PW)
    assert login.method == m.AUTH_SASL
    assert login.error is None and login.kinds[-1] == "Z"
    assert query_as(p) == "app@app"
