"""Session parameters, sans-IO: which SETs a link needs, which spellings are one encoding."""

from __future__ import annotations

import pytest

from pypool.pooling.params import (
    canonical_name,
    reported,
    same_encoding,
    set_statements,
    unreported,
)

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
    assert canonical_name("geqo") is None
    assert canonical_name("Geqo", ("geqo",)) == "geqo"
    # PgBouncer 1.26's defaults: taken at startup, tracked where the server reports them.
    assert canonical_name("Search_Path") == "search_path"
    assert canonical_name("DEFAULT_TRANSACTION_READ_ONLY") == "default_transaction_read_only"


def test_tracked_where_the_server_reports_them() -> None:
    """PostgreSQL 15 reports default_transaction_read_only, not search_path: a startup
    search_path is unreported there (unless track_extra_parameters lists it), and nothing
    of the five always-tracked parameters ever is."""
    pg15 = {"default_transaction_read_only": "off", "TimeZone": "UTC"}
    assert reported(pg15, ()) == ("default_transaction_read_only",)
    assert reported(pg15, ("Search_Path",)) == ("default_transaction_read_only", "search_path")
    params = {"search_path": "a", "default_transaction_read_only": "on", "TimeZone": "UTC",
              "scram_iterations": "4096"}
    assert unreported(params, pg15, ()) == ["search_path", "scram_iterations"]
    assert unreported(params, pg15, ("search_path",)) == ["scram_iterations"]
    pg18 = {**pg15, "search_path": '"$user", public', "scram_iterations": "4096"}
    assert unreported(params, pg18, ()) == []
