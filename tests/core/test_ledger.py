"""The frontend ledger, fed the byte sequences a client and PostgreSQL exchange.

`Exchange` plays the adapter's part (net/client.py and net/server.py): it splits the bytes
into messages and tells the ledger what each one is. The ledger must say a server may go back
exactly when PostgreSQL owes the client nothing more.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypool.core import ledger as lg
from pypool.core.ledger import FrontendLedger
from pypool.pooling.pool import PoolStats
from pypool.pooling.prepared import ServerStatements
from pypool.pooling.prepared.registry import Registry
from pypool.protocol import messages as m
from pypool.protocol.framing import MessageBuffer

pytestmark = pytest.mark.timeout(30)


def msg(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


P = msg(b"P", b"\x00SELECT 1\x00\x00\x00")
B = msg(b"B", b"\x00\x00\x00\x00\x00\x00\x00\x00")
D = msg(b"D", b"P\x00")
E = msg(b"E", b"\x00\x00\x00\x00\x00")
S = msg(b"S")
H = msg(b"H")
Q = msg(b"Q", b"SELECT 1\x00")
COPY_Q = msg(b"Q", b"COPY t FROM STDIN\x00")
CD = msg(b"d", b"1\n")
CDONE = msg(b"c")
CFAIL = msg(b"f", b"no\x00")
X = msg(b"X")

# Backend replies.
COPY_IN = msg(b"G", b"\x00\x00\x01\x00\x00")
COPY_OUT = msg(b"H", b"\x00\x00\x01\x00\x00")
ERROR = msg(b"E", b"SERROR\x00C22P02\x00Mbad\x00\x00")
READY_I = msg(b"Z", b"I")
READY_T = msg(b"Z", b"T")
COMPLETE = msg(b"C", b"COPY 1\x00")


class Exchange:
    """A client's ledger with the two directions fed as bytes."""

    def __init__(self) -> None:
        self.ledger = FrontendLedger()
        self.queue = ServerStatements(Registry(), 100, PoolStats())  # empty: nothing tracked
        self.dropped: list[int] = []
        self.released = 0

    def client_sends(self, data: bytes) -> None:
        buffer = MessageBuffer()
        buffer.feed(data)
        for kind, _ in buffer.messages():
            action = lg.ACTION[kind]
            if action == lg.OPENS_SEGMENT:
                self.ledger.segment()
            elif action == lg.OWES_READY:
                self.ledger.request(kind)
            elif action == lg.COPY_MESSAGE:
                if not self.ledger.copy_message(kind):
                    self.dropped.append(kind)
            elif action == 0:
                raise AssertionError(f"not a frontend message: {chr(kind)}")

    def server_sends(self, data: bytes) -> None:
        buffer = MessageBuffer()
        buffer.feed(data)
        for kind, body in buffer.messages():
            if kind in (m.COPY_IN_RESPONSE, m.COPY_OUT_RESPONSE, m.COPY_BOTH_RESPONSE):
                self.ledger.copy_started(kind, self.queue.requests)
            elif kind == m.ERROR_RESPONSE:
                self.ledger.copy_failed()
            elif kind == m.READY_FOR_QUERY and self.ledger.ready() and body == b"I":
                self.released += 1


def test_simple_queries_owe_one_ready_each() -> None:
    x = Exchange()
    x.client_sends(Q + Q)
    assert x.ledger.pending == 2
    x.server_sends(READY_I)
    assert not x.ledger.idle() and x.released == 0
    x.server_sends(READY_I)
    assert x.ledger.idle() and x.released == 1


def test_an_extended_segment_owes_until_its_sync() -> None:
    x = Exchange()
    x.client_sends(P + B + D + E)
    assert x.ledger.unsynced and not x.ledger.idle()
    x.client_sends(H)  # Flush owes nothing of its own
    assert x.ledger.pending == 0 and x.ledger.unsynced
    x.client_sends(S)
    assert x.ledger.pending == 1 and not x.ledger.unsynced
    x.server_sends(READY_I)
    assert x.released == 1


def test_inside_a_transaction_the_ledger_is_idle_but_not_released() -> None:
    x = Exchange()
    x.client_sends(Q)
    x.server_sends(READY_T)
    assert x.ledger.idle() and x.released == 0


def test_extended_copy_in_two_syncs_one_ready() -> None:
    """The bug: the first Sync reaches the server in copy-in mode and is ignored."""
    x = Exchange()
    x.client_sends(P + B + E + S)
    x.server_sends(COPY_IN)
    assert x.ledger.copy == lg.COPY_IN and x.ledger.pending == 0
    assert not x.ledger.idle()  # the COPY is in progress: never hand the server on
    x.client_sends(CD + CD + CDONE)
    assert x.ledger.unsynced and not x.ledger.idle()  # the server waits for a Sync
    x.client_sends(S)
    x.server_sends(COMPLETE + READY_I)
    assert x.ledger.idle() and x.released == 1 and not x.ledger.doubtful


def test_extended_copy_pipelined_whole() -> None:
    x = Exchange()
    x.client_sends(P + B + E + S + CD + CDONE + S)
    assert x.ledger.pending == 2
    x.server_sends(COPY_IN)
    assert x.ledger.pending == 1 and x.ledger.copy == lg.NO_COPY
    x.server_sends(COMPLETE + READY_I)
    assert x.ledger.idle() and x.released == 1


def test_extended_copy_with_copy_done_but_no_sync_yet() -> None:
    x = Exchange()
    x.client_sends(P + B + E + S + CD + CDONE)
    x.server_sends(COPY_IN)
    assert x.ledger.unsynced and not x.ledger.idle()
    x.client_sends(S)
    x.server_sends(COMPLETE + READY_I)
    assert x.released == 1


def test_syncs_sent_during_copy_in_are_not_counted() -> None:
    x = Exchange()
    x.client_sends(P + B + E + S)
    x.server_sends(COPY_IN)
    x.client_sends(CD + S + CD + CDONE + S)
    assert x.ledger.pending == 1
    x.server_sends(COMPLETE + READY_I)
    assert x.released == 1 and not x.ledger.doubtful


def test_extended_copy_that_fails_skips_to_the_next_sync() -> None:
    x = Exchange()
    x.client_sends(P + B + E + S)
    x.server_sends(COPY_IN)
    x.client_sends(CD)
    x.server_sends(ERROR)
    assert x.ledger.copy == lg.NO_COPY and x.ledger.unsynced
    x.client_sends(CDONE + S)  # discarded by the server up to the Sync, which it answers
    x.server_sends(READY_I)
    assert x.released == 1 and not x.ledger.doubtful


def test_a_sync_during_copy_then_a_failure_is_doubtful() -> None:
    x = Exchange()
    x.client_sends(P + B + E + S)
    x.server_sends(COPY_IN)
    x.client_sends(CD + S)
    x.server_sends(ERROR)
    assert x.ledger.doubtful


def test_a_sync_sent_with_bad_data_then_copy_done_is_doubtful() -> None:
    """CopyData (bad), Sync, CopyDone in one write: the server may fail on the data before
    it reads the Sync, and then answers it. Whether or not CopyDone was sent first."""
    x = Exchange()
    x.client_sends(COPY_Q)
    x.server_sends(COPY_IN)
    x.client_sends(CD + S + CDONE)
    x.server_sends(ERROR)
    assert x.ledger.doubtful


def test_a_parse_during_copy_in_is_doubtful() -> None:
    """Any non-copy message in copy-in ends the COPY with an error, and what follows it is
    answered: the count of replies owed is lost."""
    x = Exchange()
    x.client_sends(COPY_Q)
    x.server_sends(COPY_IN)
    x.client_sends(P + B + E + S)
    assert x.ledger.doubtful


@pytest.mark.parametrize("inside", [Q, P + B + E + S, msg(b"F", b"\x00" * 10)],
                         ids=["query", "segment", "function-call"])
def test_a_request_sent_before_the_copy_in_response_is_doubtful(inside: bytes) -> None:
    """The same when the client sent it before the CopyInResponse came, after the COPY and
    before its CopyDone: the server reads it in copy-in all the same. (Found by the
    two-client property, tests/net/test_two_clients.py: a Query there was counted as
    owed its own ReadyForQuery, the COPY's CopyDone as ending it, and the ledger was owed
    nothing while the server sat in a second COPY: handed on, it read the next client's
    query as copy data.)"""
    x = Exchange()
    x.client_sends(COPY_Q + inside + S + CDONE + COPY_Q)
    x.server_sends(COPY_IN)
    assert x.ledger.doubtful


@pytest.mark.parametrize("before", [Q, P + B + E + S])
def test_an_extended_copy_behind_an_answered_request_is_not_doubtful(before: bytes) -> None:
    """A segment opened while a request was owed leaves a mark in `owed`; once that request
    is answered the mark goes, and a COPY the segment runs is judged as usual."""
    x = Exchange()
    x.client_sends(before + P + B + E + S)
    x.server_sends(READY_I)
    x.server_sends(COPY_IN)
    assert not x.ledger.doubtful and x.ledger.copy == lg.COPY_IN
    x.client_sends(CD + CDONE + S)
    x.server_sends(COMPLETE + READY_I)
    assert x.ledger.idle() and x.released == 1 and x.ledger.owed == []


def test_pipelined_segments_owe_one_ready_each() -> None:
    """Three segments sent before any reply: three ReadyForQuery, then nothing owed."""
    x = Exchange()
    x.client_sends((P + B + E + S) * 3)
    assert x.ledger.pending == 3
    x.server_sends(READY_I + READY_I)
    assert not x.ledger.idle() and x.released == 0
    x.server_sends(READY_I)
    assert x.ledger.idle() and x.released == 1 and x.ledger.owed == []


def test_two_copies_in_one_query() -> None:
    """COPY a FROM STDIN; COPY b FROM STDIN: the first CopyDone bounds nothing of the second,
    whose Syncs in copy-in are ignored too."""
    x = Exchange()
    x.client_sends(msg(b"Q", b"COPY a FROM STDIN; COPY b FROM STDIN\x00"))
    x.server_sends(COPY_IN)
    x.client_sends(CD + CDONE)
    x.server_sends(COMPLETE + COPY_IN)
    assert x.ledger.copy == lg.COPY_IN
    x.client_sends(CD + S + CDONE)
    assert x.ledger.pending == 1
    x.server_sends(COMPLETE + READY_I)
    assert x.released == 1 and not x.ledger.doubtful


def test_simple_copy_in() -> None:
    x = Exchange()
    x.client_sends(COPY_Q)
    x.server_sends(COPY_IN)
    assert x.ledger.pending == 1 and not x.ledger.copy_extended
    x.client_sends(CD + CDONE)
    assert x.ledger.pending == 1 and not x.ledger.unsynced
    x.server_sends(COMPLETE + READY_I)
    assert x.released == 1


def test_copy_messages_after_a_failed_copy_are_dropped() -> None:
    """Simple COPY refused by the server: ErrorResponse and ReadyForQuery come back while the
    client still sends data. Those late messages owe nothing and must take no server."""
    x = Exchange()
    x.client_sends(COPY_Q)
    x.server_sends(COPY_IN)
    x.server_sends(ERROR + READY_I)
    assert x.released == 1
    x.client_sends(CD + CD + CDONE)
    assert x.dropped == [m.COPY_DATA, m.COPY_DATA, m.COPY_DONE]
    assert x.ledger.idle()


def test_copy_out_is_answered_normally() -> None:
    x = Exchange()
    x.client_sends(P + B + E + S)
    x.server_sends(COPY_OUT)
    assert x.ledger.copy == lg.COPY_OUT and x.ledger.pending == 1 and not x.ledger.idle()
    x.server_sends(msg(b"d", b"1\n") + msg(b"c") + COMPLETE + READY_I)
    assert x.released == 1


def test_a_ready_for_query_nobody_asked_for_is_doubtful() -> None:
    x = Exchange()
    x.server_sends(READY_I)
    assert x.ledger.doubtful


# --- against a model --------------------------------------------------------------------------

class Server:
    """What PostgreSQL does with a client's stream, as far as ReadyForQuery goes: a model of
    postgres.c's message loop for Query, Sync, the extended messages and COPY FROM STDIN
    (a Query or Execute of a COPY enters copy-in; `bad` CopyData fails it)."""

    def __init__(self) -> None:
        self.copy_in = False
        self.copy_extended = False
        self.skipping = False  # after an extended-protocol error, until the next Sync
        self.out: list[bytes] = []

    def feed(self, kind: bytes, is_copy: bool = False, bad: bool = False) -> None:
        if self.copy_in:
            if kind == b"d":
                if bad:
                    self._copy_error()
            elif kind in (b"c", b"f"):
                self.copy_in = False
                if kind == b"f":
                    self.out.append(ERROR)
                    self._after_error()
                else:
                    self.out.append(COMPLETE)
                    if not self.copy_extended:
                        self.out.append(READY_I)
            elif kind in (b"S", b"H"):
                pass  # ignored in copy-in
            else:
                self._copy_error()
                self.feed(kind)
            return
        if self.skipping:
            if kind == b"S":
                self.skipping = False
                self.out.append(READY_I)
            return
        if kind == b"Q":
            if is_copy:
                self.copy_in, self.copy_extended = True, False
                self.out.append(COPY_IN)
            else:
                self.out.append(READY_I)
        elif kind == b"E" and is_copy:
            self.copy_in, self.copy_extended = True, True
            self.out.append(COPY_IN)
        elif kind == b"S":
            self.out.append(READY_I)
        # CopyData/CopyDone/CopyFail outside copy-in: ignored; P/B/D/E: no ReadyForQuery

    def _copy_error(self) -> None:
        self.copy_in = False
        self.out.append(ERROR)
        self._after_error()

    def _after_error(self) -> None:
        if self.copy_extended:
            self.skipping = True
        else:
            self.out.append(READY_I)


STEP = st.sampled_from(["query", "select-segment", "copy-simple", "copy-extended"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(STEP, st.integers(0, 3), st.booleans(), st.booleans()),
                min_size=1, max_size=8), st.booleans())
def test_the_ledger_agrees_with_the_model(steps, pipelined) -> None:
    """Drivers' exchanges, one after another, each fully answered before the next: after each
    the ledger owes nothing and the server was released once. Each message is answered
    before the next is sent, or (`pipelined`) the whole exchange is sent before any reply is
    read, as a driver that does not wait for CopyInResponse would."""
    x = Exchange()
    server = Server()
    for done, (step, rows, fail, sync_in_copy) in enumerate(steps, 1):
        frames: list[tuple[bytes, bool, bool]] = []
        if step == "query":
            frames = [(b"Q", False, False)]
        elif step == "select-segment":
            frames = [(b"P", False, False), (b"B", False, False), (b"E", False, False),
                      (b"S", False, False)]
        elif step == "copy-simple":
            frames = [(b"Q", True, False)]
        else:
            frames = [(b"P", False, False), (b"B", False, False), (b"E", True, False),
                      (b"S", False, False)]
        data_frames = [(b"d", False, fail and i == rows - 1) for i in range(rows)]
        if sync_in_copy and step == "copy-extended" and not fail:
            data_frames.append((b"S", False, False))  # after CopyData: ignored, no failure
        end = [(b"c", False, False)] + ([(b"S", False, False)] if step == "copy-extended"
                                        else [])
        if step.startswith("copy"):
            frames += data_frames + end
        for kind, is_copy, bad in frames:
            body = {b"Q": b"x\x00", b"P": b"\x00x\x00\x00\x00", b"B": b"\x00" * 8,
                    b"E": b"\x00" * 5, b"d": b"1\n"}.get(kind, b"")
            x.client_sends(msg(kind, body))
            server.feed(kind, is_copy, bad)
            if not pipelined:
                replies, server.out = server.out, []
                for reply in replies:
                    x.server_sends(reply)
        replies, server.out = server.out, []
        for reply in replies:
            x.server_sends(reply)
        assert x.ledger.idle(), (step, x.ledger.owed, x.ledger.pending, x.ledger.unsynced)
        assert not x.ledger.doubtful
        assert x.released == done


def test_a_sync_in_copy_in_is_not_answered_and_so_not_queued() -> None:
    """`answers` is the one rule the prepared-statement queue follows: it queues a request
    only when the ledger counts it."""
    ledger = FrontendLedger()
    ledger.request(m.QUERY)
    assert ledger.answers(m.SYNC)
    ledger.copy_started(m.COPY_IN_RESPONSE,
                        ServerStatements(Registry(), 100, PoolStats()).requests)
    assert not ledger.answers(m.SYNC)
    assert ledger.answers(m.QUERY)
    pending = ledger.pending
    ledger.request(m.SYNC)
    assert ledger.pending == pending  # not counted either
