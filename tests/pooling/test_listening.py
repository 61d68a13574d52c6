"""pooling/listening.py: a pool's channels and its listening connection's messages, fed
bytes; and the session record's part of listen_mode = shared (session_state/record.py)."""

from __future__ import annotations

import struct

import pytest

from pypool.pooling import session_state as ss
from pypool.pooling.listening import LISTENING, LOST, Listening, channel_name, quote_channel
from pypool.protocol import messages as m

pytestmark = pytest.mark.timeout(10)


def notification(channel: bytes, payload: bytes, pid: int = 42) -> bytes:
    return m.message(m.NOTIFICATION_RESPONSE,
                     struct.pack("!I", pid) + channel + b"\0" + payload + b"\0")


def answered(tag: str) -> bytes:
    return m.command_complete(tag) + m.ready_for_query()


def up(hub: Listening) -> Listening:
    hub.logged_in()
    return hub


def test_channel_names_as_postgresql_spells_them() -> None:
    assert channel_name(b"news") == b"news"  # the tokenizer folded a bare word already
    assert channel_name(b'"News ""x"""') == b'News "x"'
    assert channel_name(b"a" * 80) == b"a" * 63  # NAMEDATALEN - 1
    assert quote_channel(b'News "x"') == b'"News ""x"""'


def test_a_wanted_channel_is_listened_once_and_unlistened_when_nobody_wants_it() -> None:
    hub = Listening()
    a, b = object(), object()
    hub.want(a, frozenset({b"news"}))
    assert hub.requests() == b"", "no connection yet: nothing to ask"
    up(hub)
    assert hub.requests() == m.message(m.QUERY, b'LISTEN "news"\0')
    hub.want(b, frozenset({b"news"}))
    assert hub.requests() == b"", "asked already"
    assert hub.feed(answered("LISTEN")) == []
    assert hub.listened == {b"news"} and hub.receivers(b"news") == [a, b]
    hub.want(a, frozenset())
    assert hub.requests() == b"", "b still wants it"
    hub.want(b, frozenset())
    assert hub.requests() == m.message(m.QUERY, b'UNLISTEN "news"\0')
    hub.feed(answered("UNLISTEN"))
    assert hub.listened == set() and hub.idle()


def test_notifications_come_out_in_order_even_split_across_reads() -> None:
    hub = up(Listening())
    hub.want(object(), frozenset({b"a", b"b"}))
    hub.requests()
    data = (answered("LISTEN") + answered("LISTEN") + notification(b"a", b"1")
            + notification(b"b", b"2") + notification(b"a", b"3"))
    found = hub.feed(data[:30]) + hub.feed(data[30:41]) + hub.feed(data[41:])
    assert [(channel, message[-2:-1]) for channel, message in found] == [
        (b"a", b"1"), (b"b", b"2"), (b"a", b"3")]
    assert found[0][1] == notification(b"a", b"1"), "handed on as it came"
    assert hub.received == 3 and hub.listened == {b"a", b"b"}


def test_a_refused_listen_is_not_held_and_is_counted() -> None:
    hub = up(Listening())
    hub.want(object(), frozenset({b"x"}))
    hub.requests()
    hub.feed(m.error_response("no", "55000") + m.ready_for_query())
    assert hub.listened == set() and hub.failed == 1


def test_a_lost_connection_listens_again_on_the_next() -> None:
    hub = up(Listening())
    a = object()
    hub.want(a, frozenset({b"x"}))
    hub.requests()
    hub.feed(answered("LISTEN"))
    assert hub.state == LISTENING
    assert hub.lost() == [a] and hub.state == LOST and hub.losses == 1
    assert hub.listened == set() and hub.requests() == b""
    up(hub)
    assert hub.requests() == m.message(m.QUERY, b'LISTEN "x"\0')


def test_a_shared_listen_pins_nothing_and_marks_its_server() -> None:
    session = ss.ClientSession()
    session.shared_listen = True
    server: dict[bytes, bytes | None] = {}
    session.sent(ss.classify(b'LISTEN "Chan"'), server)
    assert session.pins == {} and server == {ss.LISTENED: None}
    assert session.channels() == (frozenset(), frozenset({b"Chan"}))
    session.ready(m.TX_IDLE, 0, server)
    assert session.channels() == (frozenset({b"Chan"}), frozenset())
    assert ss.sync_statements(server, session.sets) == b"UNLISTEN *"
    session.sent(ss.classify(b"RESET ALL"), server)
    session.ready(m.TX_IDLE, 0, server)
    assert ss.LISTENED in server, "RESET ALL does not UNLISTEN"
    session.sent(ss.classify(b"DISCARD ALL"), server)
    session.ready(m.TX_IDLE, 0, server)
    assert server == {} and not session.listening, "DISCARD ALL does"


def test_a_rolled_back_shared_listen_listens_on_nothing() -> None:
    session = ss.ClientSession()
    session.shared_listen = True
    server: dict[bytes, bytes | None] = {}
    session.sent(ss.classify(b"LISTEN x"), server)
    session.sent(ss.classify(b"ROLLBACK"), server)
    session.ready(m.TX_IDLE, 0, server)
    assert not session.listening and ss.LISTENED in server, "the server is undone anyway"


def test_with_listen_mode_pin_a_listen_pins_as_before() -> None:
    session = ss.ClientSession()
    server: dict[bytes, bytes | None] = {}
    assert session.sent(ss.classify(b"LISTEN x"), server) is True
    assert session.pinned() == "listen" and server == {}
