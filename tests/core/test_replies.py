"""The reply reader and the backend ledger, fed a server's byte stream.

The reader must hand the client every byte the server sent for it, in order and untouched
(however the stream is cut into reads), stop at each ReadyForQuery so the client's ledger can
decide a release, keep the pooler's own queries' replies from every client, and settle each
of those queries by its own reply.
"""

from __future__ import annotations

import struct

import pytest

from pypool.core import backend as bk
from pypool.core import replies
from pypool.core.ledger import COPY_IN, FrontendLedger
from pypool.core.replies import ReplyReader
from pypool.pooling.params import ClientParams, params_key
from pypool.pooling.pool import PoolStats
from pypool.pooling.prepared import ServerStatements
from pypool.pooling.prepared.registry import Registry
from pypool.protocol import messages as m

pytestmark = pytest.mark.timeout(30)


def msg(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


ROW_DESCRIPTION = msg(b"T", b"\x00\x01a\x00" + b"\x00" * 18)
DATA_ROW = msg(b"D", b"\x00\x01\x00\x00\x00\x011")
SELECT_1 = msg(b"C", b"SELECT 1\x00")
SET = msg(b"C", b"SET\x00")
READY_I = msg(b"Z", b"I")
READY_T = msg(b"Z", b"T")
ERROR = msg(b"E", b"SERROR\x00C22023\x00Minvalid value\x00\x00")
TIMEZONE = msg(b"S", b"TimeZone\x00UTC\x00")
COPY_IN_RESPONSE = msg(b"G", b"\x00\x00\x01\x00\x00")
REPLY = ROW_DESCRIPTION + DATA_ROW + SELECT_1 + READY_I


def reader() -> ReplyReader:
    stats = PoolStats()
    return ReplyReader(ServerStatements(Registry(), 100, stats), stats)


def linked(client_params: dict[str, str] | None = None) -> ReplyReader:
    r = reader()
    r.frontend = FrontendLedger()
    r.client_params = {} if client_params is None else client_params
    return r


def drain(r: ReplyReader, data: bytes) -> tuple[bytes, list[tuple[int, int]]]:
    """Feed `data` as the server connection does; the client's bytes and the stops."""
    out: list[bytes] = []
    stops: list[tuple[int, int]] = []
    event = r.feed(data)
    while True:
        out.append(r.take_out())
        if event == replies.DONE:
            break
        stops.append((event, r.status if event == replies.READY else r.outcome))
        if not r.more():
            break
        event = r.feed(b"")
    return b"".join(out), stops


def test_a_whole_reply_goes_out_untouched_and_stops_at_its_ready_for_query() -> None:
    r = linked()
    out, stops = drain(r, REPLY)
    assert out == REPLY
    assert stops == [(replies.READY, m.TX_IDLE)]
    assert r.at_message_boundary()


def test_one_read_is_forwarded_without_a_copy() -> None:
    r = linked()
    r.feed(REPLY)
    assert r.take_out() is REPLY


@pytest.mark.parametrize("cut", range(1, len(REPLY)))
def test_a_reply_cut_anywhere_reaches_the_client_whole_with_one_stop(cut: int) -> None:
    r = linked()
    first, stops1 = drain(r, REPLY[:cut])
    second, stops2 = drain(r, REPLY[cut:])
    assert first + second == REPLY
    assert stops1 + stops2 == [(replies.READY, m.TX_IDLE)]
    assert r.at_message_boundary()


def test_two_ready_for_query_in_one_read_stop_twice_in_order() -> None:
    r = linked()
    out, stops = drain(r, REPLY + SELECT_1 + READY_T)
    assert out == REPLY + SELECT_1 + READY_T
    assert stops == [(replies.READY, m.TX_IDLE), (replies.READY, ord("T"))]


def test_the_bytes_after_a_stop_wait_for_the_next_feed() -> None:
    """What follows a ReadyForQuery may be the next client's (a pipeline line)."""
    r = linked()
    assert r.feed(REPLY + REPLY) == replies.READY
    assert r.take_out() == REPLY
    assert r.more()
    assert r.feed(b"") == replies.READY
    assert r.take_out() == REPLY


def test_parameter_status_updates_server_and_client_and_is_forwarded() -> None:
    params: dict[str, str] = {}
    r = linked(params)
    out, _ = drain(r, SET + TIMEZONE + READY_I)
    assert out == SET + TIMEZONE + READY_I
    assert r.params == {"TimeZone": "UTC"}
    assert params == {"TimeZone": "UTC"}


def test_covers_remembers_the_last_set_and_never_answers_from_a_stale_one() -> None:
    r = reader()
    r.params.update({"TimeZone": "UTC", "DateStyle": "ISO, MDY", "server_version": "15"})
    wanted = ClientParams({"TimeZone": "UTC", "DateStyle": "ISO, MDY"})
    assert r.covers(wanted)
    other = ClientParams(wanted)  # another client wanting the same values: the same key
    assert params_key(other) is params_key(wanted)
    assert r.covers(other)
    # The client that was covered changes a value in place, by any of dict's writes:
    # its key is forgotten, and it is compared afresh, not covered.
    wanted["TimeZone"] = "Europe/Paris"
    assert not r.covers(wanted)
    for change in (lambda p: p.update(TimeZone="Europe/Paris"),
                   lambda p: p.setdefault("search_path", "app"),
                   lambda p: p.pop("TimeZone"), lambda p: p.popitem(),
                   lambda p: p.__delitem__("DateStyle"), lambda p: p.clear(),
                   lambda p: p.__ior__({"TimeZone": "Europe/Paris"})):
        changed = ClientParams({"TimeZone": "UTC", "DateStyle": "ISO, MDY"})
        assert r.covers(changed)
        key = params_key(changed)
        change(changed)
        assert params_key(changed) is not key, change
    # A client wanting a value the server lacks, then one wanting less: each judged anew.
    assert not r.covers(ClientParams({"TimeZone": "UTC", "search_path": "app"}))
    assert r.covers(ClientParams({"TimeZone": "UTC"}))
    # The server reports a new value (a SET ran on it): what it covered before is asked
    # again against its parameters now.
    assert r.covers(ClientParams({"TimeZone": "UTC"}))
    r.frontend = FrontendLedger()
    r.client_params = ClientParams()
    drain(r, SET + msg(b"S", b"TimeZone\x00Asia/Tokyo\x00") + READY_I)
    assert not r.covers(ClientParams({"TimeZone": "UTC"}))
    assert r.covers(ClientParams({"TimeZone": "Asia/Tokyo"}))


def test_a_parameter_status_to_the_linked_client_forgets_its_key() -> None:
    """The reply reader writes the client's parameters in place (a SET the client ran): the
    server that covered them before must compare them again."""
    r = reader()
    r.params.update({"TimeZone": "UTC"})
    client = ClientParams({"TimeZone": "UTC"})
    assert r.covers(client)
    r.frontend = FrontendLedger()
    r.client_params = client
    drain(r, SET + msg(b"S", b"TimeZone\x00Asia/Tokyo\x00") + READY_I)
    assert client == {"TimeZone": "Asia/Tokyo"}
    other = reader()
    other.params.update({"TimeZone": "UTC"})
    assert other.covers(ClientParams({"TimeZone": "UTC"}))
    assert not other.covers(client)  # its old key, remembered there, no longer answers


def test_an_error_is_counted_and_ends_a_copy_in() -> None:
    r = linked()
    assert r.frontend is not None
    r.frontend.request(m.QUERY)
    drain(r, COPY_IN_RESPONSE)
    assert r.frontend.copy == COPY_IN
    drain(r, ERROR)
    assert r.frontend.copy != COPY_IN
    assert r.stats.errors == {"server": 1}


def test_statement_mode_withholds_a_ready_for_query_inside_a_transaction() -> None:
    r = linked()
    r.statement_mode = True
    out, stops = drain(r, msg(b"C", b"BEGIN\x00") + READY_T)
    assert out == msg(b"C", b"BEGIN\x00")
    assert stops == [(replies.READY, ord("T"))]


# --- the pooler's own queries (core/backend.py) ---------------------------------------------


def test_a_hidden_query_s_replies_reach_nobody_and_what_follows_does() -> None:
    r = linked()
    r.hide(bk.HIDDEN_PLAIN)
    out, stops = drain(r, SET + READY_I + REPLY)
    assert out == REPLY
    assert stops == [(replies.READY, m.TX_IDLE)]
    assert not r.backend.hidden and r.hiding == 0


def test_a_failing_plain_hidden_query_is_swallowed_and_settles_nothing() -> None:
    r = linked()
    r.hide(bk.HIDDEN_PLAIN)
    out, stops = drain(r, ERROR + READY_I)
    assert out == b""
    assert stops == []


def test_a_failed_check_is_reported_with_its_message() -> None:
    r = linked()
    r.hide(bk.HIDDEN_CHECK)
    r.hide_parameters(["TimeZone"])
    out, stops = drain(r, ERROR + READY_I + SET + READY_I)
    assert out == b""
    assert stops[0] == (replies.HIDDEN, bk.CHECK_FAILED)
    assert r.backend.last_error["M"] == "invalid value"


def test_check_then_set_settle_once_at_the_set_s_ready_for_query() -> None:
    params = {"TimeZone": "Europe/Paris"}
    r = linked(params)
    r.hide(bk.HIDDEN_CHECK)
    r.hide_parameters(["TimeZone"])
    assert r.backend.checking
    out, stops = drain(r, msg(b"C", b"SELECT 1\x00") + READY_I + SET + TIMEZONE + READY_I)
    assert out == b""
    assert stops == [(replies.HIDDEN, bk.APPLIED)]
    assert r.backend.applied == ["TimeZone"]
    assert not r.backend.checking
    assert params["TimeZone"] == "UTC"


def test_a_failed_set_is_reported_and_a_connect_query_error_is_not_taken_for_it() -> None:
    r = linked()
    r.hide(bk.HIDDEN_PLAIN)  # connect_query, failing
    r.hide_parameters(["TimeZone"])  # succeeding
    _, stops = drain(r, ERROR + READY_I + SET + READY_I)
    assert stops == [(replies.HIDDEN, bk.APPLIED)]
    r.hide_parameters(["TimeZone"])
    _, stops = drain(r, ERROR + READY_I)
    assert stops == [(replies.HIDDEN, bk.SET_FAILED)]


def test_a_check_alone_settles_at_its_own_ready_for_query() -> None:
    r = linked()
    r.hide(bk.HIDDEN_CHECK)
    _, stops = drain(r, SELECT_1 + READY_I)
    assert stops == [(replies.HIDDEN, bk.APPLIED)]
    assert r.backend.applied == []

