"""The StartupMessage's `options`: `-c name=value` settings read as startup parameters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pypool.core.client_login import tracked_parameters
from pypool.protocol.errors import PoolerError
from pypool.protocol.startup_options import ONLY_SETTINGS, OptionsError, parse_options, split_words

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("text", "settings"),
    [
        ("-c datestyle=ISO", [("datestyle", "ISO")]),
        ("  -c    datestyle=German,\\ YMD  ", [("datestyle", "German, YMD")]),
        ("-ctimezone=UTC -cdatestyle=ISO", [("timezone", "UTC"), ("datestyle", "ISO")]),
        ("--timezone=UTC --search_path=a,b", [("timezone", "UTC"), ("search_path", "a,b")]),
        ("-c t\\imezone=\\U\\TC", [("timezone", "UTC")]),
        ("-c x=", [("x", "")]),
        ("", []),
    ],
)
def test_settings_are_read_in_every_spelling(text: str, settings: list[tuple[str, str]]) -> None:
    assert parse_options(text) == settings


@pytest.mark.parametrize("text", ["-d", "-c timezone", "-c", "--=x", "datestyle=ISO", "-c =1",
                                  "-c=", "--=", "-c= -c="])
def test_anything_but_settings_is_refused(text: str) -> None:
    # "-c=": an empty option name, the class of PgBouncer 1.26.1's CVE-2026-107349 (a spin).
    with pytest.raises(OptionsError, match="only '-c config=val' and '--config=val'"):
        parse_options(text)


def test_tracked_parameters_take_the_settings_and_refuse_unknown_ones() -> None:
    params = {"user": "u", "options": "-c DateStyle=ISO -c extra_float_digits=3"}
    assert tracked_parameters(params, (), ("extra_float_digits",)) == {"DateStyle": "ISO"}
    with pytest.raises(PoolerError, match="unsupported startup parameter in options: work_mem"):
        tracked_parameters({"options": "-c work_mem=1MB"}, (), ())
    with pytest.raises(PoolerError, match="only '-c config=val'"):
        tracked_parameters({"options": "-d 5"}, (), ())
    # `options` in ignore_startup_parameters: what cannot be tracked is dropped, not refused,
    # and what can still applies.
    lenient = tracked_parameters({"options": "-c work_mem=1MB -c timezone=UTC"}, (), ("options",))
    assert lenient == {"TimeZone": "UTC"}
    assert tracked_parameters({"options": "-d 5"}, (), ("options",)) == {}
    # An empty option name with ignore_startup_parameters set but without options: refused
    # at once (PgBouncer 1.20-1.26.0 spun forever on it, CVE-2026-107349).
    with pytest.raises(PoolerError, match="only '-c config=val'"):
        tracked_parameters({"options": "-c="}, (), ("extra_float_digits",))
    assert ONLY_SETTINGS.startswith("unsupported options startup parameter")


words = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=10)


@given(st.lists(words, max_size=5))
def test_escaped_words_split_back_into_themselves(parts: list[str]) -> None:
    def escape(word: str) -> str:
        return "".join("\\" + ch if ch.isspace() or ch == "\\" else ch for ch in word)

    assert split_words("  ".join(escape(p) for p in parts)) == parts
