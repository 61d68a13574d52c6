"""The auth_file (userlist.txt) reader, PgBouncer's format."""

from __future__ import annotations

from pathlib import Path

import pytest

from pypool.auth.auth_file import format_auth_file, load_auth_file, parse_auth_file

pytestmark = pytest.mark.timeout(10)

VERIFIER = (
    "SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0$"
    "WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
    "rGOStBPgJRvWAeyRR/MTbtyq9j6SHVHOAKbOkwEXvFo="
)


def test_plain_md5_and_scram_secrets() -> None:
    text = (
        '"app" "app-secret"\n'
        '"legacy" "md5' + "0" * 32 + '"\n'
        f'"scram" "{VERIFIER}"\n'
    )
    assert parse_auth_file(text) == {
        "app": "app-secret",
        "legacy": "md5" + "0" * 32,
        "scram": VERIFIER,
    }


def test_doubled_quote_is_a_literal_quote() -> None:
    assert parse_auth_file('"we""ird" "pa""ss"""\n') == {'we"ird': 'pa"ss"'}


def test_rest_of_line_is_ignored() -> None:
    assert parse_auth_file('"app" "pw" trailing "junk" ; comment\n') == {"app": "pw"}


def test_comments_blank_and_malformed_lines_are_skipped() -> None:
    text = (
        "; a comment\n"
        "# another\n"
        "\n"
        "app pw\n"  # unquoted: not an entry
        '"only-one-field"\n'
        '"unterminated "pw\n'
        '   "indented"   "ok"   \n'
        '"tab"\t"sep"\n'
    )
    assert parse_auth_file(text) == {"indented": "ok", "tab": "sep"}


def test_spaces_inside_quotes_and_empty_secret() -> None:
    assert parse_auth_file('"a user" "a pass word"\n"nopw" ""\n') == {
        "a user": "a pass word",
        "nopw": "",
    }


def test_later_line_wins() -> None:
    assert parse_auth_file('"app" "one"\n"app" "two"\n') == {"app": "two"}


def test_crlf_line_endings() -> None:
    assert parse_auth_file('"a" "1"\r\n"b" "2"\r\n') == {"a": "1", "b": "2"}


def test_format_round_trips(tmp_path: Path) -> None:
    users = {"app": "app-secret", 'q"uote': 'x"y', "scram": VERIFIER, "sp ace": ""}
    path = tmp_path / "userlist.txt"
    path.write_text(format_auth_file(users))
    assert load_auth_file(str(path)) == users


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        load_auth_file(str(tmp_path / "nope.txt"))
