"""Session parameters the pooler tracks per client and per server.

In transaction mode a client's transactions land on different servers. The parameters a
client can see change through ParameterStatus (client_encoding, DateStyle, TimeZone,
IntervalStyle, standard_conforming_strings, application_name, plus track_extra_parameters)
are remembered per client; when a client lands on a server whose values differ, the pooler
first sends SET for the difference and hides the replies.

As PgBouncer 1.26 does, the other writable parameters PostgreSQL reports are tracked by
default too (TRACKED_WHERE_REPORTED), but only where the pool's server reports them: a value
the server does not report could change unseen (a client's own SET) and reach the next
client. Where it does not, a client's startup value of one is `unreported`: it goes to the
client's session-state record instead (pooling/session_state/), or is refused where no
record follows the client (net/client_login.py).
"""

from __future__ import annotations

TRACKED = (
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "IntervalStyle",
    "standard_conforming_strings",
    "application_name",
)

# Reported by PostgreSQL 14 (default_transaction_read_only), 16 (scram_iterations) and 18
# (search_path); tracked by default where the server reports them.
TRACKED_WHERE_REPORTED = (
    "default_transaction_read_only",
    "search_path",
    "scram_iterations",
)

# Startup parameters are case-insensitive; ParameterStatus uses these spellings.
_CANONICAL = {name.lower(): name for name in (*TRACKED, *TRACKED_WHERE_REPORTED)}


def canonical_name(name: str, extra: tuple[str, ...] = ()) -> str | None:
    """The ParameterStatus spelling of a tracked startup parameter, or None if untracked."""
    lowered = name.lower()
    if lowered in _CANONICAL:
        return _CANONICAL[lowered]
    for candidate in extra:
        if candidate.lower() == lowered:
            return candidate
    return None


def reported(server_params: dict[str, str], track_extra: tuple[str, ...]) -> tuple[str, ...]:
    """The TRACKED_WHERE_REPORTED names a pool tracks: those its server reports, and those
    track_extra_parameters lists (tracked as PgBouncer does, reported or not)."""
    extra = {name.lower() for name in track_extra}
    return tuple(name for name in TRACKED_WHERE_REPORTED
                 if name in server_params or name in extra)


def unreported(params: dict[str, str], server_params: dict[str, str],
               track_extra: tuple[str, ...]) -> list[str]:
    """The names in a client's `params` (its startup values) that the pool cannot track as
    reported parameters: TRACKED_WHERE_REPORTED names its server does not report."""
    tracked = reported(server_params, track_extra)
    return [name for name in params
            if name in TRACKED_WHERE_REPORTED and name not in tracked]


def same_encoding(a: str, b: str) -> bool:
    """Whether two client_encoding spellings name one encoding, as PostgreSQL matches them
    (case, and anything but letters and digits, ignored: 'utf-8' is UTF8; UNICODE too)."""
    def clean(value: str) -> str:
        cleaned = "".join(ch for ch in value.lower() if ch.isalnum())
        return "utf8" if cleaned == "unicode" else cleaned

    return clean(a) == clean(b)


def covers(current: dict[str, str], wanted: dict[str, str]) -> bool:
    """Whether a server's `current` parameters already have every value a client `wanted`
    (`wanted.items() <= current.items()`, written as the loop mypyc compiles to C: no
    (name, value) tuple is made per item, one lookup per name, and the same string object
    on both sides is equal without comparing; once per link on the hot path)."""
    for name, value in wanted.items():
        have = current.get(name)
        if have is not value and have != value:
            return False
    return True


def quote_literal(value: str) -> str:
    """A string literal that reads the same whatever standard_conforming_strings says: an
    E'' literal, with backslashes and quotes doubled."""
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def set_statements(wanted: dict[str, str], current: dict[str, str]) -> str:
    """SQL that makes a server's `current` parameters match `wanted`; "" when they do.

    `set_config(name, value, false)` rather than `SET name = 'value'`: SET takes a quoted
    list value (search_path's `"$user", public`) as one element; set_config parses the
    value as the ini or a startup packet would. Every value is a properly quoted literal."""
    calls = [
        f"pg_catalog.set_config({quote_literal(name)}, {quote_literal(value)}, false)"
        for name, value in wanted.items()
        if current.get(name) != value
    ]
    return f"SELECT {', '.join(calls)}" if calls else ""
