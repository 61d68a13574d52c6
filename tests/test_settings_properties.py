"""Properties of the ini and its value parsers, checked with hypothesis on generated input.

- any text as the value of any [pgbouncer] key, or as a [databases] / [users] line, makes
  load_ini return or raise SettingsError, never anything else;
- what the parsers accept means what it says: `{n}ms` is n/1000 seconds (every unit), the
  boolean spellings in any case, a comma list with any spacing, a signed integer;
- the console's SET (`replace_setting`) accepts exactly what the ini accepts for the same key
  and value, and installs the same value (they share `parse_value`); restart-only keys are
  refused by SET whatever the value;
- `parse_connstring` on any text returns or raises ValueError, and gives back a dict whose
  values needed quoting (spaces, quotes, backslashes, empty).

Each property runs ~200 examples without a deadline; the file takes a few seconds.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pypool.settings import (
    ACCEPTED_UNUSED_KEYS,
    RESTART_ONLY_KEYS,
    TLS_KEYS,
    PoolerSettings,
    SettingsError,
    load_ini,
    parse_bool,
    parse_connstring,
    parse_duration,
    parse_int,
    parse_list,
    replace_setting,
)

pytestmark = pytest.mark.timeout(60)

# tmp_path is shared by a test's examples: each one rewrites the same file before reading it.
PROPERTY = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

FIELD_KEYS = sorted(f.name for f in dataclasses.fields(PoolerSettings))
SETTABLE_KEYS = FIELD_KEYS + sorted(TLS_KEYS)
ALL_KEYS = SETTABLE_KEYS + sorted(ACCEPTED_UNUSED_KEYS) + ["no_such_key"]

# Anything that can be written to a UTF-8 file (a lone surrogate cannot).
any_char = st.characters(exclude_categories=("Cs",))
# Text shaped like values finds more than random text: digits, units, signs, lists, quotes.
value_char = st.sampled_from("0123456789.-+ ,msuinhdtrueyfalsonTRUEOFF'\"\\=x\t\u00e9")
any_text = st.one_of(st.text(any_char, max_size=40), st.text(value_char, max_size=20))
# One line of the ini: configparser would read a line break as a new line or a continuation.
line_char = st.characters(exclude_categories=("Cs",), exclude_characters="\r\n")
line_value_char = value_char.filter(lambda c: c not in "\r\n")
line_text = st.one_of(st.text(line_char, max_size=40), st.text(line_value_char, max_size=20))
# Values of the right shape for some key, so that accepting is exercised as much as refusing.
plausible = st.one_of(
    st.integers(-5, 70000).map(str),
    st.tuples(st.integers(0, 10**6), st.sampled_from(["", "ms", "s", "min", "us", " h"])).map(
        lambda t: f"{t[0]}{t[1]}"
    ),
    st.sampled_from(
        [
            "on",
            "OFF",
            "yes",
            "0",
            "transaction",
            "session",
            "statement",
            "trust",
            "md5",
            "hba",
            "disable",
            "prefer",
            "verify-full",
            "a, b ,c",
            "",
            "1.5",
        ]
    ),
)
# Names: user names in a list, keys of a connection string.
names = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789_"), min_size=1, max_size=12)


def random_case(text: str, mask: int) -> str:
    """`text` with the letters whose bit is set in `mask` in upper case."""
    return "".join(c.upper() if mask >> (i % 64) & 1 else c for i, c in enumerate(text))


case_masks = st.integers(0, 2**64 - 1)


def write_ini(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pgbouncer.ini"
    path.write_text(text, encoding="utf-8")
    return path


def loads(path: Path) -> PoolerSettings | SettingsError:
    """What load_ini makes of `path`: the settings, or the SettingsError it raised (any other
    exception propagates and fails the property)."""
    try:
        return load_ini(path).pooler
    except SettingsError as exc:
        return exc


# --- the ini never crashes ------------------------------------------------------------------


@PROPERTY
@given(st.sampled_from(ALL_KEYS), st.one_of(any_text, plausible))
def test_any_value_of_any_key_loads_or_raises_settings_error(
    tmp_path: Path, key: str, value: str
) -> None:
    loads(write_ini(tmp_path, f"[databases]\n\n[pgbouncer]\n{key} = {value}\n"))


@PROPERTY
@given(st.sampled_from(["databases", "users"]), line_text, any_text)
def test_any_database_or_user_line_loads_or_raises_settings_error(
    tmp_path: Path, section: str, name: str, value: str
) -> None:
    name = name.strip() or "x"
    if name[0] in "[;#" or "=" in name:
        name = "x" + name.replace("=", "")  # still a key line, not a header or a comment
    text = f"[pgbouncer]\nlisten_port = 6432\n\n[{section}]\n{name} = {value}\n"
    loads(write_ini(tmp_path, text))


@PROPERTY
@given(
    st.lists(
        st.one_of(
            st.text(any_char, max_size=30),
            st.sampled_from(
                [
                    "[pgbouncer]",
                    "[databases]",
                    "[users]",
                    "[DEFAULT]",
                    "[pypool]",
                    "  continued",
                    "key = value",
                    "=",
                    "[",
                ]
            ),
        ),
        max_size=12,
    )
)
def test_any_ini_text_loads_or_raises_settings_error(tmp_path: Path, lines: list[str]) -> None:
    loads(write_ini(tmp_path, "\n".join(lines)))


def test_an_ini_that_is_not_utf8_is_a_settings_error(tmp_path: Path) -> None:
    path = tmp_path / "pgbouncer.ini"
    path.write_bytes(b"[pgbouncer]\nlisten_port = 6432\n; caf\xe9 (latin-1)\n")
    with pytest.raises(SettingsError):
        load_ini(path)


# --- what the parsers accept means what it says ---------------------------------------------

UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "": 1.0}
blanks = st.text(st.sampled_from(" \t"), max_size=2)


@PROPERTY
@given(st.integers(0, 10**12), blanks, blanks)
def test_milliseconds_are_thousandths(x: int, before: str, after: str) -> None:
    assert math.isclose(parse_duration(f"{before}{x}ms{after}"), x / 1000, rel_tol=1e-12)


@PROPERTY
@given(st.integers(0, 10**9), st.integers(0, 999), st.sampled_from(sorted(UNITS)), blanks)
def test_a_decimal_in_any_unit_scales_by_that_unit(
    whole: int, thousandths: int, unit: str, gap: str
) -> None:
    text = f"{whole}.{thousandths:03d}{gap}{unit}"
    expected = (whole + thousandths / 1000) * UNITS[unit]
    assert math.isclose(parse_duration(text), expected, rel_tol=1e-12, abs_tol=1e-15)


@PROPERTY
@given(st.integers(1, 10**6), st.sampled_from(sorted(UNITS)))
def test_a_negative_duration_is_refused(x: int, unit: str) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        parse_duration(f"-{x}{unit}")


@PROPERTY
@given(st.text(any_char, max_size=20))
def test_any_duration_text_parses_to_a_non_negative_number_or_raises_value_error(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except ValueError:
        return
    assert seconds >= 0


@PROPERTY
@given(
    st.sampled_from(["1", "yes", "on", "true", "0", "no", "off", "false"]),
    case_masks,
    blanks,
    blanks,
)
def test_boolean_spellings_in_any_case(word: str, mask: int, before: str, after: str) -> None:
    assert parse_bool(before + random_case(word, mask) + after) is (
        word in ("1", "yes", "on", "true")
    )


@PROPERTY
@given(st.text(any_char, max_size=10))
def test_anything_else_is_not_a_boolean(text: str) -> None:
    if text.strip().lower() in ("1", "yes", "on", "true", "0", "no", "off", "false"):
        return
    with pytest.raises(ValueError):
        parse_bool(text)


list_item = st.text(
    st.characters(exclude_categories=("Cs", "Zs", "Cc", "Zl", "Zp"), exclude_characters=",\x85"),
    min_size=1,
    max_size=12,
)


@PROPERTY
@given(st.lists(st.tuples(list_item, blanks, blanks), max_size=6), st.booleans())
def test_a_comma_list_with_any_spacing_gives_back_its_items(
    items: list[tuple[str, str, str]], trailing_comma: bool
) -> None:
    text = ",".join(f"{before}{item}{after}" for item, before, after in items)
    if trailing_comma:
        text += ", "
    assert parse_list(text) == tuple(item for item, _, _ in items)


@PROPERTY
@given(st.integers(-(10**30), 10**30), st.sampled_from(["", "+"]), blanks, blanks)
def test_integers_round_trip(n: int, plus: str, before: str, after: str) -> None:
    text = f"{before}{plus if n >= 0 else ''}{n}{after}"
    assert parse_int(text) == n


@PROPERTY
@given(st.data())
def test_typed_values_round_trip_through_the_ini(tmp_path: Path, data: st.DataObject) -> None:
    # One key of each kind, written as an operator would, read back as the value it means.
    millis = data.draw(st.integers(0, 10**9))
    flag = data.draw(st.booleans())
    users = data.draw(st.lists(names, max_size=4))
    size = data.draw(st.integers(0, 2147483647))
    text = (
        f"[pgbouncer]\nquery_timeout = {millis}ms\n"
        f"log_connections = {random_case('on' if flag else 'off', data.draw(case_masks))}\n"
        f"admin_users = {' , '.join(users)}\n"
        f"default_pool_size = {size}\n"
    )
    got = load_ini(write_ini(tmp_path, text)).pooler
    assert math.isclose(got.query_timeout, millis / 1000, rel_tol=1e-12)
    assert got.log_connections is flag
    assert got.admin_users == tuple(users)
    assert got.default_pool_size == size


# --- SET and the ini share one validator ----------------------------------------------------


@PROPERTY
@given(st.sampled_from(SETTABLE_KEYS), case_masks, st.one_of(line_text, plausible))
@example(key="default_pool_size", mask=0, value="-1")
@example(key="query_wait_timeout", mask=0, value="1.5min")
@example(key="pkt_buf", mask=0, value="8192")
@example(key="server_tls_sslmode", mask=0, value="verify-full")
@example(key="auth_file", mask=0, value="../users.txt")
def test_set_accepts_exactly_what_the_ini_accepts(
    tmp_path: Path, key: str, mask: int, value: str
) -> None:
    written = random_case(key, mask)
    from_ini = loads(write_ini(tmp_path, f"[pgbouncer]\n{written} = {value}\n"))
    try:
        from_set: PoolerSettings | SettingsError = replace_setting(PoolerSettings(), written, value)
    except SettingsError as exc:
        from_set = exc
    if key in RESTART_ONLY_KEYS:
        assert isinstance(from_set, SettingsError), "SET changed a restart-only key"
        assert "cannot be changed at runtime" in str(from_set)
        return
    assert isinstance(from_set, SettingsError) == isinstance(from_ini, SettingsError), (
        from_ini,
        from_set,
    )
    if isinstance(from_ini, SettingsError) or key in TLS_KEYS:
        return
    assert isinstance(from_set, PoolerSettings)
    expected = getattr(from_set, key)
    relative_paths = ("auth_file", "auth_hba_file", "auth_ident_file")
    if key in relative_paths and expected and not Path(expected).is_absolute():
        expected = str(tmp_path / expected)  # the ini's auth_file is relative to its folder
    assert getattr(from_ini, key) == expected


# --- connection strings ---------------------------------------------------------------------

connstring_char = st.sampled_from("ab=' \\\t\"x1_")


@PROPERTY
@given(st.one_of(st.text(any_char, max_size=40), st.text(connstring_char, max_size=30)))
def test_any_connstring_parses_or_raises_value_error(text: str) -> None:
    try:
        parsed = parse_connstring(text)
    except ValueError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in parsed.items())


def quote_connstring_value(value: str) -> str:
    """A value as libpq quotes it: in single quotes, with \\ and ' escaped by a backslash."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Values that need quoting, and ones that do not.
quoted_values = st.text(st.one_of(st.sampled_from(" '\\\"=\t"), any_char), max_size=20)
# (Cc, Zs, Zl and Zp hold every character str.isspace() knows.)
bare_values = st.text(
    st.characters(exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), exclude_characters="'\\"),
    min_size=1,
    max_size=15,
)


@PROPERTY
@given(
    st.dictionaries(
        names, st.tuples(st.one_of(quoted_values, bare_values), st.booleans()), max_size=6
    ),
    st.text(st.sampled_from(" \t"), min_size=1, max_size=3),
    case_masks,
)
def test_connstring_round_trip_with_quotes_and_backslashes(
    entries: dict[str, tuple[str, bool]], gap: str, mask: int
) -> None:
    parts = []
    for key, (value, doubled) in entries.items():
        if not value or value[0] == "'" or any(c.isspace() or c in "\\'" for c in value):
            # Either escape for a quote: a backslash, or the quote doubled.
            text = (
                quote_connstring_value(value)
                if not doubled
                else "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
            )
        else:
            text = value
        parts.append(f"{random_case(key, mask)}{' ' if doubled else ''}={text}")
    assert parse_connstring(gap.join(parts)) == {k: v for k, (v, _) in entries.items()}
