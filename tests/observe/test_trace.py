"""The protocol trace's decoder (protocol/describe.py) and printer, fed bytes built by
protocol/messages.py."""

from __future__ import annotations

import struct

from pypool.observe.trace import MessageStream, TraceFilter, Tracer, WireTrace
from pypool.protocol import messages as m
from pypool.protocol.describe import CLIENT, SERVER, describe, describe_startup, mask_passwords


def parse(name: str, sql: str) -> bytes:
    return m.message(m.PARSE, m.cstring(name) + m.cstring(sql) + b"\0\1" + b"\0\0\0\x17")


def bind(statement: str, values: list[bytes | None]) -> bytes:
    body = m.cstring("") + m.cstring(statement) + b"\0\0" + struct.pack("!H", len(values))
    for value in values:
        body += b"\xff\xff\xff\xff" if value is None else struct.pack("!I", len(value)) + value
    return m.message(m.BIND, body + b"\0\0")


def lines_of(*chunks: bytes, sender: str = CLIENT) -> list[str]:
    out: list[str] = []
    tracer = Tracer(out.append)
    for chunk in chunks:
        tracer.data("C-1", "S-2", sender, chunk)
    return out


def test_frontend_messages_one_line_each() -> None:
    data = (parse("s1", "SELECT $1::int") + bind("s1", [b"42", None])
            + m.describe_portal() + m.execute() + m.sync())
    out = lines_of(data)
    assert len(out) == 5
    assert 'Parse name="s1" query="SELECT $1::int" param_types=1' in out[0]
    assert 'Bind portal="" statement="s1" params=["42", NULL]' in out[1]
    assert 'Describe portal ""' in out[2]
    assert 'Execute portal="" max_rows=0' in out[3]
    assert "Sync" in out[4]
    assert all(line.startswith("C-1 > S-2") and line.endswith("forwarded") for line in out)


def test_backend_messages_and_the_same_type_bytes() -> None:
    data = (m.parse_complete() + m.row_description([("n", 23)]) + m.data_row(["42"])
            + m.command_complete("SELECT 1") + m.error_response("boom", "22012")
            + m.parameter_status("TimeZone", "UTC") + m.ready_for_query(m.TX_IDLE))
    out = [line.split("  ")[0] for line in lines_of(data, sender=SERVER)]
    text = "\n".join(lines_of(data, sender=SERVER))
    assert len(out) == 7
    assert "ParseComplete" in text and "RowDescription columns=1 [n]" in text
    assert "DataRow values=1 [42]" in text and 'CommandComplete tag="SELECT 1"' in text
    assert 'ErrorResponse ERROR 22012 "boom"' in text
    assert 'ParameterStatus TimeZone="UTC"' in text and "ReadyForQuery status=I" in text
    # 'D', 'C', 'E', 'S' mean other things from a client:
    assert describe(CLIENT, ord("S"), b"") == "Sync"
    assert describe(SERVER, ord("S"), b"a\0b\0") == 'ParameterStatus a="b"'


def test_cut_at_every_byte_gives_the_same_lines() -> None:
    data = parse("", "SELECT 1") + m.sync() + m.query("SELECT 2")
    whole = lines_of(data)
    pieces = lines_of(*[data[i : i + 1] for i in range(len(data))])
    assert whole == pieces and len(whole) == 3


def test_long_bodies_are_shortened() -> None:
    sql = "SELECT " + ", ".join(str(n) for n in range(5000))
    [line] = lines_of(m.query(sql))
    assert len(line) < 250
    assert "..." in line and f"({len(sql) + 1} bytes)" in line  # the full size


def test_passwords_and_scram_are_never_printed() -> None:
    secret = "s3cr3t-Pa55"
    proof = b"c=biws,r=nonce,p=PROOFPROOFPROOF="
    out = lines_of(
        m.password_message(m.cstring(secret)),
        m.sasl_initial_response("SCRAM-SHA-256", b"n,,n=,r=clientnonce"),
        m.password_message(proof),
        m.query(f"ALTER ROLE app PASSWORD '{secret}'"),
    )
    out += lines_of(m.authentication(m.AUTH_SASL_CONTINUE, b"r=nonce,s=SALT,i=4096"),
                    m.authentication(m.AUTH_SASL_FINAL, b"v=SIGNATURE"),
                    m.authentication(5, b"salt"), m.backend_key_data(77, 123456789),
                    m.authentication_sasl(["SCRAM-SHA-256"]), sender=SERVER)
    text = "\n".join(out)
    for leak in (secret, "PROOF", "clientnonce", "SALT", "SIGNATURE", "salt", "123456789"):
        assert leak not in text, leak
    assert text.count("PasswordMessage (not shown)") == 3
    assert "ALTER ROLE app PASSWORD '***'" in text
    assert "AuthenticationSASLContinue (not shown)" in text
    assert "AuthenticationSASL mechanisms=SCRAM-SHA-256" in text
    assert "BackendKeyData pid=77 secret=(not shown)" in text


def test_startup_packets() -> None:
    startup = m.startup_message({"user": "app", "database": "app"})
    stream = MessageStream(startup=True)
    [(kind, body, _)] = list(stream.feed(startup))
    assert kind == 0
    assert describe_startup(body) == 'StartupMessage version=3.0 user="app" database="app"'
    cancel = m.cancel_request(5, 987654)
    text = describe_startup(cancel[4:])
    assert text == "CancelRequest pid=5 secret=(not shown)"
    assert describe_startup(struct.pack("!I", 80877103)) == "SSLRequest"


def test_what_the_pooler_did_is_on_the_line() -> None:
    out: list[str] = []
    tracer = Tracer(out.append)
    tracer.message("pooler", "S-2", CLIENT, m.PARSE, parse("PYPOOL_1", "SELECT 1")[5:],
                   "injected")
    tracer.message("S-2", "pooler", SERVER, m.PARSE_COMPLETE, b"", "swallowed")
    assert out[0].startswith("pooler > S-2") and out[0].endswith("injected")
    assert "ParseComplete" in out[1] and out[1].endswith("swallowed")


def test_filter_by_id_or_application_name() -> None:
    class Client:
        def __init__(self, id: int, app: str) -> None:
            self.id, self.params = id, {"application_name": app}

    one = TraceFilter(ids={3})
    by_app = TraceFilter(application_names={"lab"})
    assert one.wants(Client(3, "x")) and not one.wants(Client(4, "x"))
    assert by_app.wants(Client(9, "lab")) and not by_app.wants(Client(9, "web"))
    assert TraceFilter(everyone=True).wants(Client(1, ""))
    assert not TraceFilter() and not TraceFilter().wants(Client(1, ""))


def test_masking_handles_quotes() -> None:
    assert mask_passwords("CREATE ROLE a PASSWORD 'it''s'") == "CREATE ROLE a PASSWORD '***'"


# --- WireTrace: the actions, from what passed the four socket points ---------------------------


class _State:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeClient:
    def __init__(self, id: int) -> None:
        self.id, self.state, self.admin, self.server = id, _State("IDLE"), None, None
        self.params: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"C-{self.id}:app/app@127.0.0.1:5000"


class FakeServer:
    def __init__(self, id: int, client: FakeClient) -> None:
        self.id, self.state, self.client = id, _State("ACTIVE"), client
        self.chain: list[FakeClient] = []

    def __repr__(self) -> str:
        return f"S-{self.id}:app/app@127.0.0.1:5432"


BIND_COMPLETE = m.message(m.BIND_COMPLETE, b"")


def wire() -> tuple[WireTrace, list[str], FakeClient, FakeServer]:
    out: list[str] = []
    trace = WireTrace(Tracer(out.append))
    client = FakeClient(1)
    server = FakeServer(2, client)
    client.server = server  # type: ignore[assignment]
    # Both connections are past their login (whose first packets have no type byte).
    startup = m.startup_message({"user": "app", "database": "app"})
    client.state = _State("STARTUP")
    trace.client_read(client, startup)
    client.state = _State("IDLE")
    trace.server_write(server, startup, own=True)
    out.clear()
    return trace, out, client, server


def actions(out: list[str]) -> list[tuple[str, str, str]]:
    """(source > target, message name, action) of each line."""
    return [(line[:20].strip(), line[21:].split(" ")[0], line.rsplit(" ", 1)[1])
            for line in out]


def test_wire_trace_tells_the_actions_apart() -> None:
    trace, out, client, server = wire()
    # The client prepared s1 earlier; now it binds it on a server that lacks it.
    trace.client_read(client, bind("s1", [b"7"]) + m.execute() + m.sync())
    trace.server_write(server, parse("PYPOOL_1", "SELECT $1::int") + bind("PYPOOL_1", [b"7"])
                       + m.execute() + m.sync())
    trace.server_read(server, m.parse_complete() + BIND_COMPLETE + m.data_row(["7"])
                      + m.command_complete("SELECT 1") + m.ready_for_query(m.TX_IDLE))
    trace.client_write(client, BIND_COMPLETE + m.data_row(["7"])
                       + m.command_complete("SELECT 1") + m.ready_for_query(m.TX_IDLE))
    trace.server_done(server)
    assert actions(out) == [
        ("pooler > S-2", "Parse", "injected"),
        ("C-1 > pooler", "Bind", "rewritten"),
        ("C-1 > S-2", "Bind", "rewritten"),
        ("C-1 > S-2", "Execute", "forwarded"),
        ("C-1 > S-2", "Sync", "forwarded"),
        ("S-2 > pooler", "ParseComplete", "swallowed"),
        ("S-2 > C-1", "BindComplete", "forwarded"),
        ("S-2 > C-1", "DataRow", "forwarded"),
        ("S-2 > C-1", "CommandComplete", "forwarded"),
        ("S-2 > C-1", "ReadyForQuery", "forwarded"),
    ]
    assert 'statement="s1"' in out[1] and 'statement="PYPOOL_1"' in out[2]


def test_wire_trace_synthesised_and_hidden() -> None:
    trace, out, client, server = wire()
    # A Parse the server already has: answered by the pooler, never sent.
    trace.client_read(client, parse("s1", "SELECT 1") + m.sync())
    trace.server_write(server, m.query("SET TimeZone = 'UTC'"), own=True)
    trace.server_write(server, m.sync())
    trace.server_read(server, m.command_complete("SET") + m.ready_for_query(m.TX_IDLE)
                      + m.ready_for_query(m.TX_IDLE))
    trace.client_write(client, m.parse_complete() + m.ready_for_query(m.TX_IDLE))
    trace.server_done(server)
    assert actions(out) == [
        ("pooler > S-2", "Query", "injected"),
        ("C-1 > pooler", "Parse", "swallowed"),
        ("C-1 > S-2", "Sync", "forwarded"),
        ("pooler > C-1", "ParseComplete", "synthesised"),
        ("S-2 > pooler", "CommandComplete", "swallowed"),
        ("S-2 > pooler", "ReadyForQuery", "swallowed"),
        ("S-2 > C-1", "ReadyForQuery", "forwarded"),
    ]


def test_wire_trace_a_whole_injected_request_is_not_the_clients() -> None:
    trace, out, client, server = wire()
    # The session-state guard runs its own Bind and Execute before the client's.
    trace.client_read(client, bind("s1", [b"x"]) + m.execute() + m.sync())
    trace.server_write(server, bind("PYPOOL_GUARD", [b"12345678"]) + m.execute()
                       + bind("PYPOOL_1", [b"x"]) + m.execute() + m.sync())
    assert actions(out) == [
        ("pooler > S-2", "Bind", "injected"),
        ("pooler > S-2", "Execute", "injected"),
        ("C-1 > pooler", "Bind", "rewritten"),
        ("C-1 > S-2", "Bind", "rewritten"),
        ("C-1 > S-2", "Execute", "forwarded"),
        ("C-1 > S-2", "Sync", "forwarded"),
    ]


def test_wire_trace_tls_answers_keep_the_streams_in_step() -> None:
    out: list[str] = []
    trace = WireTrace(Tracer(out.append))
    client = FakeClient(1)
    server = FakeServer(2, client)
    client.state = _State("STARTUP")
    trace.client_read(client, b"\x16\x03\x01\x02\x00")  # a direct TLS ClientHello
    trace.client_read(client, m.startup_message({"user": "app", "database": "app"}))
    server.state = _State("LOGIN")
    trace.server_read(server, b"N")  # the server's answer to the pooler's SSLRequest
    trace.server_read(server, m.authentication(m.AUTH_OK))
    assert actions(out) == [
        ("C-1 > pooler", "TLS", "swallowed"),
        ("C-1 > pooler", "StartupMessage", "swallowed"),
        ("S-2 > pooler", "SSL", "swallowed"),
        ("S-2 > pooler", "AuthenticationOk", "swallowed"),
    ]
