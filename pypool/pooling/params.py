"""Session parameters the pooler tracks per client and per server.

In transaction mode a client's transactions land on different servers. The parameters a
client can see change through ParameterStatus (client_encoding, DateStyle, TimeZone,
IntervalStyle, standard_conforming_strings, application_name, plus track_extra_parameters)
are remembered per client; when a client lands on a server whose values differ, the pooler
first sends SET for the difference and hides the replies.
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

# Startup parameters are case-insensitive; ParameterStatus uses these spellings.
_CANONICAL = {name.lower(): name for name in TRACKED}


def canonical_name(name: str, extra: tuple[str, ...] = ()) -> str | None:
    """The ParameterStatus spelling of a tracked startup parameter, or None if untracked."""
    lowered = name.lower()
    if lowered in _CANONICAL:
        return _CANONICAL[lowered]
    for candidate in extra:
        if candidate.lower() == lowered:
            return candidate
    return None


def same_encoding(a: str, b: str) -> bool:
    """Whether two client_encoding spellings name one encoding, as PostgreSQL matches them
    (case, and anything but letters and digits, ignored: 'utf-8' is UTF8; UNICODE too)."""
    def clean(value: str) -> str:
        cleaned = "".join(ch for ch in value.lower() if ch.isalnum())
        return "utf8" if cleaned == "unicode" else cleaned

    return clean(a) == clean(b)


def covers(current: dict[str, str], wanted: dict[str, str]) -> bool:
    """Whether a server's `current` parameters already have every value a client `wanted`
    (`wanted.items() <= current.items()`, written as the loop mypyc compiles to C, over
    the keys: no (name, value) tuple is made per item; once per link on the hot path)."""
    for name in wanted:
        if current.get(name) != wanted[name]:
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
