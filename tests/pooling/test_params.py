"""Session parameters, sans-IO: which SETs a link needs, which spellings are one encoding."""

from __future__ import annotations

import pytest

from pypool.pooling.params import canonical_name, same_encoding, set_statements

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(("client", "server"), [
    ("'utf-8'", "UTF8"),  # asyncpg sends the quotes
    ("utf-8", "UTF8"),
    ("UNICODE", "UTF8"),
    ("latin1", "LATIN1"),
    ("sql_ascii", "SQL_ASCII"),
])
def test_spellings_of_one_encoding(client: str, server: str) -> None:
    assert same_encoding(client, server)


@pytest.mark.parametrize(("client", "server"), [("latin1", "UTF8"), ("win1252", "WIN1251")])
def test_different_encodings(client: str, server: str) -> None:
    assert not same_encoding(client, server)


def test_set_statements_only_for_differences() -> None:
    sql = set_statements({"TimeZone": "UTC", "application_name": "it's"},
                         {"TimeZone": "UTC", "application_name": "x"})
    assert sql == "SELECT pg_catalog.set_config(E'application_name', E'it''s', false)"
    assert set_statements({"TimeZone": "UTC"}, {"TimeZone": "UTC"}) == ""


def test_set_statements_quote_backslashes_and_keep_lists() -> None:
    """A backslash cannot end the literal early whatever standard_conforming_strings says,
    and a list value (search_path) stays a list: set_config parses it, SET would not."""
    sql = set_statements({"application_name": "a\\'; DROP TABLE t; --",
                          "search_path": '"$user", public'}, {})
    assert sql == (
        "SELECT pg_catalog.set_config(E'application_name', E'a\\\\''; DROP TABLE t; --', "
        "false), pg_catalog.set_config(E'search_path', E'\"$user\", public', false)"
    )


def test_canonical_names() -> None:
    assert canonical_name("datestyle") == "DateStyle"
    assert canonical_name("search_path") is None
    assert canonical_name("Search_Path", ("search_path",)) == "search_path"
