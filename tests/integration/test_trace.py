"""The protocol trace against a real PostgreSQL: each line's fields (source, target, message,
what the pooler did) checked for a simple Query, a Parse the pooler injects on a second
server, a hidden SET, logins that must not leak a password, and the console's switch."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.admin.console_client import console
from tests.conftest import APP_PASSWORD, APP_USER, PoolerFactory
from tests.integration.polling import wait_for

from . import pgwire
from .pgwire import Wire, kinds

pytestmark = pytest.mark.timeout(40)

P, B, E, S, Q = pgwire.parse, pgwire.bind, pgwire.execute, pgwire.sync, pgwire.query
LINE = re.compile(r" INFO (\S+) > (\S+) +(.*?) +(\w+)$")


def trace_lines(log: str) -> list[tuple[str, str, str, str]]:
    """(source, target, message, action) of each trace line of the pooler's log."""
    found = []
    for line in log.splitlines():
        match = LINE.search(line)
        if match and re.match(r"^(C|S)-\d+$|^pooler$", match.group(1)):
            found.append((match.group(1), match.group(2), match.group(3), match.group(4)))
    return found


def about(lines: list[tuple[str, str, str, str]], *labels: str) -> list[tuple[str, ...]]:
    return [line for line in lines if line[0] in labels or line[1] in labels]


async def connect(p: Any, **params: str) -> Wire:
    return await Wire.connect(p.host, p.port, APP_USER, APP_PASSWORD, "app", **params)


async def client_id(wire: Wire) -> str:
    """The C-n label of the connection, read back from the pooler's SHOW CLIENTS."""
    got = await wire.run(Q("SELECT pg_backend_pid()"))
    return str(got[1][1][0])


def until(p: Any, predicate: Any) -> list[tuple[str, str, str, str]]:
    assert wait_for(lambda: predicate(trace_lines(p.log())), 5), p.log()[-4000:]
    return trace_lines(p.log())


async def test_a_simple_query_round_trip(pooler: PoolerFactory) -> None:
    p = pooler({"trace": "on"})
    wire = await connect(p)
    assert await wire.run(Q("SELECT 41 + 1 AS answer")) == [
        ("T", (("answer", 23, 0),)), ("D", ("42",)), ("C", "SELECT 1"), ("Z", "I")]
    lines = until(p, lambda ls: any("ReadyForQuery status=I" in line[2] and line[1] != "pooler"
                                    and line[0].startswith("S-") for line in ls))
    query = next(i for i, line in enumerate(lines) if 'query="SELECT 41 + 1' in line[2])
    client, server = lines[query][0], lines[query][1]
    assert re.fullmatch(r"C-\d+", client) and re.fullmatch(r"S-\d+", server)
    assert lines[query] == (client, server, 'Query query="SELECT 41 + 1 AS answer" (24 bytes)',
                            "forwarded")
    after = [line for line in lines[query + 1:] if line[:2] == (server, client)]
    assert [(line[2], line[3]) for line in after[:4]] == [
        ("RowDescription columns=1 [answer]", "forwarded"),
        ("DataRow values=1 [42] (8 bytes)", "forwarded"),
        ('CommandComplete tag="SELECT 1"', "forwarded"),
        ("ReadyForQuery status=I", "forwarded"),
    ]
    # The welcome is the pooler's own: it never came from a server.
    welcome = [line for line in lines if line[:2] == ("pooler", client)]
    assert welcome[0][2:] == ("AuthenticationSASL mechanisms=SCRAM-SHA-256", "synthesised")
    assert ("AuthenticationOk", "synthesised") in [line[2:] for line in welcome]
    await wire.close()


async def test_a_parse_injected_on_a_second_server(pooler: PoolerFactory) -> None:
    p = pooler({"trace": "on", "default_pool_size": "2"})
    a, b = await connect(p), await connect(p)
    assert kinds(await a.run(P("s1", "SELECT $1::int * 10 AS v"), S())) == "1Z"
    first = await client_id(a)
    assert await b.run(Q("BEGIN")) == [("C", "BEGIN"), ("Z", "T")]  # b keeps a's server
    got = await a.run(B("", "s1", ["4"]), E(), S())
    assert got == [("2",), ("D", ("40",)), ("C", "SELECT 1"), ("Z", "I")]
    assert await client_id(a) != first  # a second server, which had to be given s1
    await b.run(Q("COMMIT"))
    lines = until(p, lambda ls: sum(1 for line in ls if "injected" == line[3]
                                    and line[2].startswith("Parse")) >= 1)
    parses = [line for line in lines if line[2].startswith("Parse ")]
    # The client's own Parse, as it sent it, then as it went on: renamed to the pooler's
    # name for the statement.
    asked, client_parse = parses[0], parses[1]
    assert re.fullmatch(r"C-\d+", asked[0]) and asked[1] == "pooler"
    assert asked[2:] == ('Parse name="s1" query="SELECT $1::int * 10 AS v" param_types=0 '
                         "(30 bytes)", "rewritten")
    assert client_parse[0] == asked[0] and client_parse[1].startswith("S-")
    assert client_parse[3] == "rewritten"
    name = re.search(r'name="(\w+)"', client_parse[2])
    assert name and name.group(1) != "s1"
    assert 'query="SELECT $1::int * 10 AS v" param_types=0' in client_parse[2]
    # On the second server the pooler injected the same statement before the Bind ...
    injected = next(line for line in parses if line[3] == "injected")
    second = injected[1]
    assert injected[0] == "pooler" and second != client_parse[1]
    assert injected[2] == client_parse[2]
    on_second = [line for line in lines if second in line[:2] or line[1] == "pooler"]
    at = on_second.index(injected)
    assert on_second[at + 1][:2] == (asked[0], "pooler")  # the client's Bind, as sent
    assert on_second[at + 1][2].startswith('Bind portal="" statement="s1" params=["4"]')
    bind = on_second[at + 2]
    assert bind[0] == client_parse[0] and bind[3] == "rewritten"
    assert bind[2].startswith(f'Bind portal="" statement="{name.group(1)}" params=["4"]')
    # ... and swallowed its ParseComplete: the client saw only the BindComplete.
    replies = [line for line in on_second[at:] if line[0] == second]
    assert replies[0] == (second, "pooler", "ParseComplete", "swallowed")
    assert replies[1] == (second, client_parse[0], "BindComplete", "forwarded")
    for wire in (a, b):
        await wire.close()


async def test_a_hidden_set_of_the_clients_timezone(pooler: PoolerFactory) -> None:
    p = pooler({"trace": "on", "default_pool_size": "1"})
    utc = await connect(p)
    assert (await utc.run(Q("SHOW TimeZone")))[1][1][0] != "Asia/Tokyo"
    await utc.close()
    tokyo = await connect(p, TimeZone="Asia/Tokyo")
    assert (await tokyo.run(Q("SHOW TimeZone")))[1] == ("D", ("Asia/Tokyo",))
    lines = until(p, lambda ls: any("Asia/Tokyo" in line[2] and line[3] == "injected"
                                    for line in ls))
    set_line = next(line for line in lines if "Asia/Tokyo" in line[2] and line[3] == "injected")
    assert set_line[0] == "pooler"
    assert set_line[2].startswith("Query query=\"SELECT pg_catalog.set_config(E'TimeZone', "
                                  "E'Asia/Tokyo', ")
    server = set_line[1]
    after = [line for line in lines[lines.index(set_line):] if line[0] == server]
    # Its replies stay with the pooler (set_config's row, and the ParameterStatus the pooler
    # reads to learn the new value); then the client's own query is answered.
    assert [line[1:] for line in after[:5]] == [
        ("pooler", "RowDescription columns=1 [set_config]", "swallowed"),
        ("pooler", "DataRow values=1 [Asia/Tokyo] (16 bytes)", "swallowed"),
        ("pooler", 'CommandComplete tag="SELECT 1"', "swallowed"),
        ("pooler", 'ParameterStatus TimeZone="Asia/Tokyo"', "swallowed"),
        ("pooler", "ReadyForQuery status=I", "swallowed"),
    ]
    assert after[5][2:] == ("RowDescription columns=1 [TimeZone]", "forwarded")
    assert re.fullmatch(r"C-\d+", after[5][1])
    show = next(line for line in lines if line[2].startswith('Query query="SHOW TimeZone"')
                and line[1] == server and lines.index(line) > lines.index(set_line))
    assert re.fullmatch(r"C-\d+", show[0]) and show[3] == "forwarded"
    await tokyo.close()


@pytest.mark.parametrize("auth_type", ["md5", "scram-sha-256"])
async def test_no_password_in_the_trace(pooler: PoolerFactory, auth_type: str) -> None:
    p = pooler({"trace": "on", "auth_type": auth_type})
    wire = await connect(p)
    await wire.run(Q("SELECT 1"))
    await wire.close()
    lines = until(p, lambda ls: any(line[2].startswith("PasswordMessage") for line in ls))
    log = p.log()
    assert APP_PASSWORD not in log
    passwords = [line for line in lines if line[2].startswith("PasswordMessage")]
    assert passwords and all(line[2].startswith("PasswordMessage (not shown)")
                             for line in passwords)
    # The client's answers stay with the pooler; the pooler's own login to PostgreSQL
    # (SCRAM with the server) is its own, injected, shown by length only too.
    assert {line[1] for line in passwords if line[0].startswith("C-")} == {"pooler"}
    assert all(line[3] == "injected" for line in passwords if line[0] == "pooler")
    assert not re.search(r"[rspv]=[A-Za-z0-9+/=,]{8,}", log)  # no SCRAM attribute leaked
    request = "AuthenticationMD5Password" if auth_type == "md5" else "AuthenticationSASL"
    assert any(line[2].startswith(request) and line[3] == "synthesised" for line in lines)


def test_the_console_switch_traces_one_client(pooler: PoolerFactory) -> None:
    import psycopg

    from tests.integration.app_client import connect as app_connect

    p = pooler()
    with app_connect(p.dsn() + "?application_name=traced") as traced, \
            app_connect(p.dsn() + "?application_name=quiet") as quiet, \
            console(p) as admin:
        traced.execute("SELECT 'before'")
        rows = admin.execute("SHOW CLIENTS").fetchall()
        columns = [c.name for c in admin.execute("SHOW CLIENTS").description or []]
        ids = {row[columns.index("application_name")]: row[columns.index("id")]
               for row in rows}
        cur = admin.execute(f"TRACE {ids['traced']} on")
        assert cur.statusmessage == "TRACE 1"
        state = dict(admin.execute("SHOW STATE").fetchall())
        assert state["trace_clients"] == str(ids["traced"])
        traced.execute("SELECT 'traced-one'")
        quiet.execute("SELECT 'quiet-one'")
        lines = until(p, lambda ls: any("traced-one" in line[2] for line in ls))
        assert all(line[0] == f"C-{ids['traced']}" or line[1] == f"C-{ids['traced']}"
                   or line[0] in ("pooler",) or line[0].startswith("S-")
                   for line in lines)
        assert "quiet-one" not in p.log()
        assert admin.execute(f"TRACE {ids['traced']} off").statusmessage == "TRACE 0"
        traced.execute("SELECT 'after-off'")
        # by application_name, for clients to come as well
        assert admin.execute("TRACE quiet on").statusmessage == "TRACE 1"
        quiet.execute("SELECT 'quiet-two'")
        until(p, lambda ls: any("quiet-two" in line[2] for line in ls))
        assert "after-off" not in p.log()
        with pytest.raises(psycopg.Error, match="on or off"):
            admin.execute("TRACE quiet maybe")


def config(admin: Any) -> dict[str, str]:
    return {row[0]: row[1] for row in admin.execute("SHOW CONFIG").fetchall()}


def test_trace_on_by_set_and_off_by_reload(pooler: PoolerFactory) -> None:
    from tests.integration.app_client import connect as app_connect

    p = pooler()
    with app_connect(p.dsn()) as conn, console(p) as admin:
        conn.execute("SELECT 'untraced'")
        admin.execute("SET trace = on")
        conn.execute("SELECT 'everyone'")
        until(p, lambda ls: any("everyone" in line[2] for line in ls))
        assert config(admin)["trace"] == "1"
        p.rewrite_config({"trace": "off"})
        p.reload()
        assert wait_for(lambda: config(admin)["trace"] == "0", 5)
        conn.execute("SELECT 'after-reload'")
        conn.execute("SELECT 'untraced'")
    log = p.log()
    assert "after-reload" not in log and "'untraced'" not in log
