"""MessageBuffer and header_at: whole messages out of a byte stream, however it is split."""

from __future__ import annotations

import pytest

from pypool.protocol import messages as m
from pypool.protocol.framing import FramingError, MessageBuffer, MessageTooLarge, header_at

pytestmark = pytest.mark.timeout(10)


def stream() -> bytes:
    return (
        m.query("SELECT 1")
        + m.message(m.PARSE, b"s1\x00SELECT $1\x00\x00\x00")
        + m.sync()
        + m.message(m.COPY_DATA, b"x" * 1000)
        + m.terminate()
    )


EXPECTED = [
    (ord("Q"), b"SELECT 1\x00"),
    (ord("P"), b"s1\x00SELECT $1\x00\x00\x00"),
    (ord("S"), b""),
    (ord("d"), b"x" * 1000),
    (ord("X"), b""),
]


def test_whole_stream_in_one_feed() -> None:
    buf = MessageBuffer()
    buf.feed(stream())
    assert list(buf.messages()) == EXPECTED
    assert len(buf) == 0


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 6, 7, 13, 999, 1001])
def test_any_split_yields_the_same_messages(chunk: int) -> None:
    data = stream()
    buf = MessageBuffer()
    got = []
    for start in range(0, len(data), chunk):
        buf.feed(data[start : start + chunk])
        got.extend(buf.messages())
    assert got == EXPECTED
    assert len(buf) == 0


def test_incomplete_message_stays_buffered_until_complete() -> None:
    msg = m.query("SELECT 42")
    buf = MessageBuffer()
    buf.feed(msg[:-1])
    assert list(buf.messages()) == []
    assert len(buf) == len(msg) - 1
    buf.feed(msg[-1:])
    assert list(buf.messages()) == [(ord("Q"), b"SELECT 42\x00")]


def test_only_a_partial_header_is_not_a_message() -> None:
    buf = MessageBuffer()
    buf.feed(b"Q\x00\x00")
    assert list(buf.messages()) == []
    assert len(buf) == 3


def test_memoryview_and_bytearray_input() -> None:
    buf = MessageBuffer()
    buf.feed(memoryview(m.sync()))
    buf.feed(bytearray(m.query("x")))
    assert list(buf.messages()) == [(ord("S"), b""), (ord("Q"), b"x\x00")]


def test_take_rest_returns_unconsumed_bytes_and_empties() -> None:
    buf = MessageBuffer()
    buf.feed(m.sync() + b"Q\x00\x00\x00\x09SEL")
    msgs = buf.messages()
    assert next(msgs) == (ord("S"), b"")
    msgs.close()  # stop after the first message: the consumed one is dropped
    assert buf.take_rest() == b"Q\x00\x00\x00\x09SEL"
    assert len(buf) == 0


def test_take_rest_after_stopping_without_closing_the_iterator() -> None:
    # A login loop that returns from inside `for ... in messages()` and calls take_rest()
    # while the generator is still suspended must not get the consumed message again.
    buf = MessageBuffer()
    buf.feed(m.ready_for_query() + m.query("after"))
    msgs = buf.messages()
    assert next(msgs) == (ord("Z"), b"I")
    assert buf.take_rest() == m.query("after")
    assert list(msgs) == []


def test_stopping_early_keeps_later_messages() -> None:
    buf = MessageBuffer()
    buf.feed(m.sync() + m.query("a") + m.query("b"))
    for kind, _body in buf.messages():
        assert kind == ord("S")
        break
    assert list(buf.messages()) == [(ord("Q"), b"a\x00"), (ord("Q"), b"b\x00")]


@pytest.mark.parametrize("length", [0, 1, 2, 3])
def test_length_below_four_is_a_framing_error(length: int) -> None:
    buf = MessageBuffer()
    buf.feed(b"Q" + length.to_bytes(4, "big") + b"\x00" * 8)
    with pytest.raises(FramingError):
        list(buf.messages())


def test_oversize_message_rejected_from_its_header_alone() -> None:
    buf = MessageBuffer(max_size=100)
    # Only the header of a 1 MB message: rejected before its body is buffered.
    buf.feed(b"d" + (1_000_000 + 4).to_bytes(4, "big"))
    with pytest.raises(FramingError, match="max_packet_size"):
        list(buf.messages())


def test_message_exactly_at_max_size_passes_one_more_fails() -> None:
    # max_size counts the whole message, type byte and length included.
    ok = m.message(m.COPY_DATA, b"a" * 95)
    assert len(ok) == 100
    buf = MessageBuffer(max_size=100)
    buf.feed(ok)
    assert list(buf.messages()) == [(ord("d"), b"a" * 95)]
    buf.feed(m.message(m.COPY_DATA, b"a" * 96))
    with pytest.raises(FramingError):
        list(buf.messages())


def test_messages_before_an_oversize_one_are_still_delivered() -> None:
    buf = MessageBuffer(max_size=50)
    buf.feed(m.sync() + b"d" + (10_000).to_bytes(4, "big"))
    got = []
    with pytest.raises(FramingError):
        for item in buf.messages():
            got.append(item)
    assert got == [(ord("S"), b"")]


def test_header_at() -> None:
    data = b"junk" + m.query("SELECT 1")
    kind, size = header_at(data, 4)
    assert kind == ord("Q")
    assert size == len(m.query("SELECT 1"))
    assert header_at(memoryview(data), 4) == (kind, size)
    with pytest.raises(FramingError):
        header_at(b"Q\x00\x00\x00\x03", 0)


def test_too_large_says_how_large_and_the_limit() -> None:
    buf = MessageBuffer(max_size=100)
    buf.feed(b"p" + (1 << 30).to_bytes(4, "big"))
    with pytest.raises(MessageTooLarge) as info:
        list(buf.messages())
    assert (info.value.size, info.value.limit) == ((1 << 30) + 1, 100)
    assert isinstance(info.value, FramingError)
