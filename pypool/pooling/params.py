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

from typing import Any, Final

from mypy_extensions import mypyc_attr

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
    on both sides is equal without comparing). At a link it runs only when the server has
    not yet covered these values (core/replies.py `ReplyReader.covers`)."""
    for name, value in wanted.items():
        have = current.get(name)
        if have is not value and have != value:
            return False
    return True


# ClientParams keys by value, so that clients with the same values share one; cleared when
# it grows past this (a key already given out stays valid: it is only ever compared by
# identity, and no other values can come to have it).
_KEYS: dict[frozenset[tuple[str, str]], frozenset[tuple[str, str]]] = {}
_KEYS_MAX: Final = 4096


@mypyc_attr(native_class=False)
class ClientParams(dict[str, str]):
    """A client's tracked parameters, as it should see them: a dict that knows when it
    changed. Its key (`params_key`) is one object for all the ClientParams that hold the
    same values, made when first asked and forgotten at any change, whoever makes it (every
    method that writes is overridden here). A server remembers the values it last found it covers by
    that key (core/replies.py `ReplyReader.covers`): at a link, one identity comparison
    answers for every client of an application instead of a comparison of two dicts, whose
    entries, in a real run, are fetched from memory each time (bench/README.md).

    A plain Python class (mypyc compiles no dict subclass natively); its reads are the
    dict's."""

    __slots__ = ("_key",)

    def __init__(self, *args: Any, **kwargs: str) -> None:
        super().__init__(*args, **kwargs)
        self._key: frozenset[tuple[str, str]] | None = None

    # --- every write forgets the key --------------------------------------------------------

    def __setitem__(self, name: str, value: str) -> None:
        self._key = None
        super().__setitem__(name, value)

    def __delitem__(self, name: str) -> None:
        self._key = None
        super().__delitem__(name)

    def update(self, *args: Any, **kwargs: str) -> None:  # type: ignore[override]
        self._key = None
        super().update(*args, **kwargs)

    def setdefault(self, name: str, default: str = "") -> str:  # type: ignore[override]
        self._key = None
        return super().setdefault(name, default)

    def pop(self, *args: Any) -> Any:
        self._key = None
        return super().pop(*args)

    def popitem(self) -> tuple[str, str]:
        self._key = None
        return super().popitem()

    def clear(self) -> None:
        self._key = None
        super().clear()

    def __ior__(self, other: Any) -> ClientParams:  # type: ignore[override,misc]
        self._key = None
        super().__ior__(other)
        return self


def params_key(params: ClientParams) -> frozenset[tuple[str, str]]:
    """The key of `params` (see ClientParams). A module function, not a method: a method of
    this plain Python class is reached through a generic lookup and a bound method each
    call, which a real run's profile showed costing as much as the rest of the link's check
    (core/replies.py `ReplyReader.covers`; bench/README.md)."""
    key = params._key
    if key is None:
        items = frozenset(params.items())
        key = _KEYS.get(items)
        if key is None:
            if len(_KEYS) >= _KEYS_MAX:
                _KEYS.clear()
            key = _KEYS[items] = items
        params._key = key
    return key


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
