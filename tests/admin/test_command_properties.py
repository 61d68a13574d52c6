"""Properties of the console's command parser (AdminSession.dispatch), on generated lines.

- any line, from an admin or a stats user, is answered (result bytes, Done or WaitFor) or
  refused with the console's own AdminError or InvalidCommand, never anything else;
- words are case-insensitive and whitespace around them, and a trailing `;`, change nothing:
  every `SHOW <what>` answers the same bytes however it is spelled;
- `PAUSE <db>` pauses exactly that database, named bare or in "double quotes" with ""
  escapes, and refuses one the pooler does not serve;
- `SET key = value` (or `TO`) installs the value the ini parser makes of it, quoted in single
  quotes with '' escapes or bare, with the key in any case.

The pooler behind the console is a recording stand-in with no pools, so only the parser and
the commands' own checks run; each property runs ~200 examples without a deadline.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pypool.admin import show
from pypool.admin.commands import AdminError, Done, InvalidCommand, WaitFor
from pypool.admin.console import AdminSession
from pypool.observe.view import PoolerView
from pypool.pooling import stats as st_stats
from pypool.pooling.client_limits import ClientCounts
from pypool.settings import DatabaseEntry, PoolerSettings, Settings, parse_value

pytestmark = pytest.mark.timeout(60)

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class RecordingPooler:
    """The pooler's state and control surface (observe/view.py's PoolerState, admin/control.py's
    PoolerControl) with nothing behind it: switches are plain attributes, calls are recorded."""

    settings: Settings
    pools: dict[Any, Any] = field(default_factory=dict)
    clients: list[Any] = field(default_factory=list)
    login_clients: list[Any] = field(default_factory=list)
    paused_all: bool = False
    paused_dbs: set[str] = field(default_factory=set)
    disabled_dbs: set[str] = field(default_factory=set)
    retired: dict[str, DatabaseEntry] = field(default_factory=dict)
    servers_per_db: dict[str, int] = field(default_factory=dict)
    servers_per_user: dict[str, int] = field(default_factory=dict)
    auth_secrets: dict[str, str] = field(default_factory=dict)
    auth_query_secrets: dict[str, str] = field(default_factory=dict)
    stats_periods: st_stats.StatsPeriods = field(
        default_factory=lambda: st_stats.StatsPeriods(100.0)
    )
    shutting_down: str = ""
    suspended: bool = False
    console_queries: int = 0
    console_logins: int = 0
    client_counts: ClientCounts = field(default_factory=ClientCounts)
    calls: list[tuple[str, object]] = field(default_factory=list)

    def now(self) -> float:
        return 100.0

    def pause_all(self, paused: bool) -> None:
        self.paused_all = paused
        self.calls.append(("pause_all", paused))

    def set_paused(self, pool: Any, paused: bool) -> None:
        self.calls.append(("set_paused", paused))

    def tag_dirty(self, pool: Any, reason: str) -> None:
        self.calls.append(("tag_dirty", reason))

    def close_server(self, server: Any, reason: str) -> None:
        self.calls.append(("close_server", reason))

    def reload(self) -> bool:
        self.calls.append(("reload", None))
        return True

    def apply_settings(self, new: Settings) -> None:
        self.calls.append(("apply_settings", new))
        self.settings = new

    def shutdown(self, how: str) -> None:
        self.calls.append(("shutdown", how))


def console(
    databases: tuple[str, ...] = ("app", "bench"), is_admin: bool = True
) -> tuple[AdminSession, RecordingPooler]:
    entries = {name: DatabaseEntry(name=name) for name in databases}
    pooler = RecordingPooler(
        Settings(pooler=PoolerSettings(default_pool_size=5), databases=entries)
    )
    return AdminSession(PoolerView(pooler), pooler, object(), is_admin), pooler  # type: ignore[arg-type]


def random_case(text: str, mask: int) -> str:
    """`text` with the letters whose bit is set in `mask` in upper case."""
    return "".join(c.upper() if mask >> (i % 64) & 1 else c for i, c in enumerate(text))


def quote_name(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_value(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


case_masks = st.integers(0, 2**64 - 1)
# Whitespace as a client might send it around and between words (at least one between).
space = st.text(st.sampled_from(" \t\n\r"), max_size=3)
gap = st.text(st.sampled_from(" \t\n\r"), min_size=1, max_size=3)
ending = st.sampled_from(["", ";", " ;", "; ", ";\n", "\t;\t"])
# Query text as the console receives it: decoded UTF-8, no NUL (it ends the Query).
query_chars = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")

# Lines built from the console's own words, quotes and punctuation reach deeper than noise.
WORDS = [
    "show",
    "SET",
    "pause",
    "resume",
    "kill",
    "kill_client",
    "reconnect",
    "wait_close",
    "disable",
    "enable",
    "reload",
    "shutdown",
    "wait_for_servers",
    "select",
    "pools",
    "config",
    "help",
    "stats",
    "clients",
    "servers",
    "databases",
    "users",
    "lists",
    "client_encoding",
    "app",
    "pgbouncer",
    "pypool",
    "nosuch",
    "default_pool_size",
    "server_reset_query",
    "listen_port",
    "pool_mode",
    "client_tls_sslmode",
    "=",
    "to",
    "'",
    "''",
    '"',
    '""',
    ";",
    "1",
    "-1",
    "10ms",
    "transaction",
    "'x'",
    '"app"',
    "\\",
    "\u00e9",
    "99999999999999999999",
]
token_lines = st.lists(st.tuples(st.sampled_from(WORDS), space), max_size=7).map(
    lambda parts: "".join(word + sep for word, sep in parts)
)
any_line = st.one_of(st.text(query_chars, max_size=60), token_lines)


def answered(reply: object) -> None:
    assert isinstance(reply, bytes | Done | WaitFor), reply


# --- any line: an answer or the console's own refusal ---------------------------------------


@PROPERTY
@given(any_line, st.booleans())
@example("SET default_pool_size = '-1'", True)
@example("KILL_CLIENT 99999999999999999999", True)
@example('PAUSE ""', True)
@example("SHUTDOWN WAIT_FOR_SERVERS", True)
def test_any_line_is_answered_or_refused_by_the_console(line: str, is_admin: bool) -> None:
    session, _ = console(is_admin=is_admin)
    try:
        answered(session.dispatch(line))
    except (AdminError, InvalidCommand):
        pass


@PROPERTY
@given(any_line)
def test_a_stats_user_changes_nothing(line: str) -> None:
    session, pooler = console(is_admin=False)
    try:
        session.dispatch(line)
    except (AdminError, InvalidCommand):
        pass
    assert pooler.calls == []
    assert (pooler.paused_all, pooler.paused_dbs, pooler.disabled_dbs) == (False, set(), set())


# --- case and whitespace --------------------------------------------------------------------


@PROPERTY
@given(
    st.sampled_from(sorted([*show.SHOWS, *show.FAKE_PARAMS, "help"])),
    case_masks,
    space,
    gap,
    space,
    ending,
    st.booleans(),
)
def test_show_is_the_same_however_it_is_spelled(
    what: str, mask: int, before: str, between: str, after: str, end: str, is_admin: bool
) -> None:
    # SHOW FDS is an admin's only (PgBouncer: the fds carry cancel keys).
    session, _ = console(is_admin=is_admin or what == "fds")
    canonical = session.dispatch(f"SHOW {what.upper()}")
    assert isinstance(canonical, bytes) and canonical  # a result set, CommandComplete last
    assert canonical.startswith((b"T", b"N"))
    line = f"{before}{random_case('show', mask)}{between}{random_case(what, mask >> 4)}{after}{end}"
    assert session.dispatch(line) == canonical


def test_show_fds_needs_an_admin() -> None:
    session, _ = console(is_admin=False)
    with pytest.raises(AdminError, match="admin access needed"):
        session.dispatch("SHOW FDS")


@PROPERTY
@given(st.sampled_from(sorted(show.SHOWS)))
def test_a_quoted_show_target_is_the_same_target(what: str) -> None:
    session, _ = console()
    assert session.dispatch(f'SHOW "{what}"') == session.dispatch(f"show {what}")


@PROPERTY
@given(st.text(query_chars, min_size=1, max_size=12))
def test_an_unknown_show_is_an_invalid_command(what: str) -> None:
    if what.strip().lower().strip('"') in {*show.SHOWS, *show.FAKE_PARAMS, "help"}:
        return
    session, _ = console()
    with pytest.raises((InvalidCommand, AdminError)):
        session.dispatch(f"SHOW {quote_name(what)}")


# --- PAUSE <db> -----------------------------------------------------------------------------

bare_names = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789_"), min_size=1, max_size=12
)
any_names = st.text(query_chars, min_size=1, max_size=16)


@PROPERTY
@given(
    st.one_of(bare_names.map(lambda n: (n, n)), any_names.map(lambda n: (n, quote_name(n)))),
    case_masks,
    space,
    gap,
    space,
    ending,
)
@example(('we"ird', '"we""ird"'), 0, "", " ", "", "")
@example(("two words", '"two words"'), 0, "", " ", "", ";")
@example(('"', '""""'), 0, " ", "\t", " ", ";")
def test_pause_pauses_exactly_the_database_named(
    name_and_written: tuple[str, str], mask: int, before: str, between: str, after: str, end: str
) -> None:
    name, written = name_and_written
    session, pooler = console(databases=("other", name))
    line = f"{before}{random_case('pause', mask)}{between}{written}{after}{end}"
    if name in ("pgbouncer", "pypool"):
        with pytest.raises(AdminError, match="cannot pause admin db"):
            session.dispatch(line)
        return
    reply = session.dispatch(line)
    assert isinstance(reply, WaitFor) and reply.tag == "PAUSE"
    assert reply.until()  # no pools, so no servers to wait for
    assert pooler.paused_dbs == {name}
    assert not pooler.paused_all


@PROPERTY
@given(bare_names, case_masks, space, ending)
def test_pause_of_a_database_not_served_is_refused(
    name: str, mask: int, before: str, end: str
) -> None:
    session, pooler = console(databases=("app",))
    if name == "app":
        return
    with pytest.raises(AdminError) as refused:
        session.dispatch(f"{before}{random_case('pause', mask)} {name}{end}")
    assert refused.value.message in (f"no such database: {name}", f"cannot pause admin db: {name}")
    assert pooler.paused_dbs == set() and not pooler.paused_all


@PROPERTY
@given(case_masks, space, space, ending)
def test_pause_without_a_database_pauses_all(mask: int, before: str, after: str, end: str) -> None:
    session, pooler = console()
    reply = session.dispatch(f"{before}{random_case('pause', mask)}{after}{end}")
    assert isinstance(reply, WaitFor) and reply.tag == "PAUSE"
    assert pooler.paused_all and pooler.calls == [("pause_all", True)]


# --- SET key = value ------------------------------------------------------------------------

set_values = st.text(query_chars, max_size=30)


def installed(pooler: RecordingPooler) -> PoolerSettings:
    assert [name for name, _ in pooler.calls] == ["apply_settings"]
    new = pooler.calls[0][1]
    assert isinstance(new, Settings)
    return new.pooler


@PROPERTY
@given(
    set_values, case_masks, st.sampled_from(["=", "to", "TO", "To"]), space, space, space, ending
)
@example("SELECT 'it''s'", 0, "=", " ", " ", "", "")
@example("", 0, "=", " ", " ", "", ";")
@example("a'b''c'''", 0, "to", " ", " ", " ", "; ")
@example("line one\nline two", 0, "=", "", "", "", "")
def test_set_installs_a_quoted_value_with_doubled_quotes(
    value: str, mask: int, verb: str, s1: str, s2: str, s3: str, end: str
) -> None:
    session, pooler = console()
    key = random_case("server_reset_query", mask)
    line = f"{s1}{random_case('set', mask >> 20)} {key}{s2}{verb} {quote_value(value)}{s3}{end}"
    reply = session.dispatch(line)
    assert isinstance(reply, Done) and reply.tag == f"SET {key}={value}"
    assert installed(pooler).server_reset_query == parse_value("server_reset_query", value)
    assert installed(pooler).server_reset_query == value.strip()


@PROPERTY
@given(
    st.sampled_from(
        [
            "default_pool_size",
            "reserve_pool_size",
            "max_client_conn",
            "query_wait_timeout",
            "idle_transaction_timeout",
            "log_connections",
            "pool_mode",
            "admin_users",
        ]
    ),
    st.one_of(
        st.integers(-3, 10**6).map(str),
        st.tuples(st.integers(0, 10**5), st.sampled_from(["ms", "s", "min"])).map(
            lambda t: f"{t[0]}{t[1]}"
        ),
        st.sampled_from(["on", "off", "transaction", "session", "nope", "a,b"]),
    ),
    st.booleans(),
    case_masks,
    space,
    ending,
)
def test_set_accepts_what_the_ini_parser_accepts_quoted_or_bare(
    key: str, text: str, quoted: bool, mask: int, s1: str, end: str
) -> None:
    session, pooler = console()
    written = random_case(key, mask)
    value = quote_value(text) if quoted else text
    line = f"{s1}SET {written} = {value}{end}"
    try:
        expected = parse_value(key, text)
    except ValueError:
        with pytest.raises(AdminError, match="^SET failed$"):
            session.dispatch(line)
        assert pooler.calls == []
        return
    reply = session.dispatch(line)
    assert isinstance(reply, Done) and reply.tag == f"SET {written}={text}"
    new = installed(pooler)
    assert getattr(new, key) == expected
    assert dataclasses.replace(
        new, **{key: getattr(PoolerSettings(default_pool_size=5), key)}
    ) == PoolerSettings(default_pool_size=5)  # nothing else changed


@PROPERTY
@given(
    st.sampled_from(["listen_port", "listen_addr", "pkt_buf", "workers", "logfile"]),
    st.integers(1, 9999).map(str),
)
def test_set_of_a_restart_only_key_fails_and_changes_nothing(key: str, value: str) -> None:
    session, pooler = console()
    with pytest.raises(AdminError, match="^SET failed$"):
        session.dispatch(f"SET {key} = {value}")
    assert pooler.calls == []
