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
    assert sql == "SET application_name = 'it''s';"
    assert set_statements({"TimeZone": "UTC"}, {"TimeZone": "UTC"}) == ""


def test_canonical_names() -> None:
    assert canonical_name("datestyle") == "DateStyle"
    assert canonical_name("search_path") is None
    assert canonical_name("Search_Path", ("search_path",)) == "search_path"
