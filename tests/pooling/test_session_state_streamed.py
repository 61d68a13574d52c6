"""A Query's session state judged on its start (pooling/session_state/streamed.py): wherever
the text is cut and however the rest arrives, the outcome is what the whole text gives, or a
pin (UNTRACKABLE), never a change left unseen or a SET recorded from a cut text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from pypool.pooling import session_state as ss

pytestmark = pytest.mark.timeout(120)

TEMPLATES = [
    b"SET a.b = '{pad}'",
    b"SET a.b = 1; SET c.d = '{pad}'",
    b"SELECT set_config('a.b', 'c', false), '{pad}'",
    b"SELECT set_config('a.b', 'c', false OR true), '{pad}'",
    b"SELECT '{pad}', pg_advisory_lock(1)",
    b"SELECT pg_advisory_lock(1), '{pad}'",
    b"SELECT pg_advisory_lock       (1), '{pad}'",
    b"/* {pad} */ SET a.b = 1",
    b"  SELECT set_config('x.y','z',false) /* {pad} */",
    b"INSERT INTO t VALUES ('{pad}'); PREPARE p AS SELECT 1",
    b"INSERT INTO t VALUES ('{pad}')",
    b"LISTEN c; SELECT '{pad}'",
    b"SELECT '{pad}'",
    b"(SELECT length('{pad}'))",
    b"CREATE TEMP TABLE t AS SELECT '{pad}'",
    b"CREATE TEMP TABLE t ON COMMIT DROP AS SELECT '{pad}'",
    b"DECLARE c CURSOR WITH HOLD FOR SELECT '{pad}'",
    b"RESET ALL; SELECT '{pad}'",
    b"DISCARD ALL /* {pad} */",
    b"UPDATE t SET x = '{pad}'",
]


def streamed(text: bytes, cut: int, pieces: list[int]) -> list[ss.Command]:
    """What look_start and the scan of the rest, fed in `pieces`, say of `text` cut there."""
    found, words = ss.look_start(text, 0, cut)
    if words:
        scan = ss.QueryScan(words, text[max(0, cut - 16) : cut])
        at = cut
        for size in [*pieces, len(text)]:
            if at >= len(text):
                break
            if scan.feed(text[at : at + size]):
                found.append(ss.Command(ss.UNTRACKABLE, ss.LONG_STATEMENT))
                break
            at += size
    return found


@given(hs.sampled_from(TEMPLATES), hs.integers(0, 3000), hs.integers(1, 4000),
       hs.lists(hs.integers(1, 300), max_size=8))
@settings(max_examples=600, deadline=None)
def test_the_start_says_what_the_whole_does_or_pins(template: bytes, pad: int, cut: int,
                                                   pieces: list[int]) -> None:
    text = template.replace(b"{pad}", b"x" * pad)
    cut = min(cut, len(text) - 1)
    message = b"Q" + (len(text) + 5).to_bytes(4, "big") + text + b"\x00"
    whole = ss.look(81, message, 0, len(message)) or []
    found = streamed(text, cut, pieces)
    pinned = any(c.kind == ss.UNTRACKABLE for c in found)
    assert pinned or sorted(found) == sorted(whole), (text[:80], cut, found, whole)
    assert not any(c.kind == ss.SET for c in found)  # never a replay made of a cut text


def test_a_select_of_a_literal_pins_nothing() -> None:
    text = b"SELECT length('" + b"x" * 50_000 + b"')"
    assert streamed(text, 16_000, [4096] * 20) == []
