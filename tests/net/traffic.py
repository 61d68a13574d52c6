"""What the hypothesis properties of tests/net/ send: a client's messages (their bodies cut,
padded or flipped, or well formed), a COPY as a client runs one, a stream cut into reads, and
the replies a client gets, read as type letters (an ErrorResponse with its SQLSTATE).
Shared by test_hostile_bytes.py (one client) and test_two_clients.py (two on one server).
"""

from __future__ import annotations

import os
import struct
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from pypool.protocol import messages as m

# A longer campaign: PYPOOL_HOSTILE_EXAMPLES=20000 (and pytest's --hypothesis-seed).
PROPERTY = settings(max_examples=int(os.environ.get("PYPOOL_HOSTILE_EXAMPLES", "300")),
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

names = st.sampled_from([b"", b"s1", b"s2", b"PYPOOL_1", b"p", b"x" * 70])
texts = st.sampled_from([b"SELECT 1", b"SELECT $1::int", b"SET search_path = a",
                         b"PREPARE q AS SELECT 1", b"EXECUTE q", b"DEALLOCATE ALL",
                         b"DISCARD ALL", b"LISTEN ch", b"BEGIN", b"COMMIT", b"",
                         b"select pg_advisory_lock(1); prepare z as select 1",
                         b"/* c */ SET LOCAL x = 1", b"-- only a comment",
                         b"COPY t FROM STDIN", b"ROLLBACK"])
# Pieces of the statements the session-state look and the SQL-level PREPARE parser read,
# joined in any order: quotes, comments and dollar quotes left open, keywords cut apart.
TOKENS = [b"SET", b"set", b" ", b"LOCAL", b"SESSION", b"x", b"=", b"'", b'"', b"$$", b"$a$",
          b"--", b"/*", b"*/", b";", b"TO", b"DEFAULT", b"PREPARE", b"AS", b"EXECUTE", b"(",
          b")", b"DEALLOCATE", b"ALL", b"DISCARD", b"LISTEN", b"UNLISTEN", b"*", b"LOAD",
          b"RESET", b"ROLE", b"AUTHORIZATION", b"\\", b"E'", b"pg_advisory_lock",
          b"set_config", b"CREATE", b"TEMP", b"TABLE", b"DECLARE", b"CURSOR", b"WITH HOLD",
          b"CLOSE", b"BEGIN", b"COMMIT", b"SELECT", b"\n", b"1", b",", b"TRANSACTION",
          b"ON COMMIT DROP", b"LOCK", b"NOTIFY", b"DO", b"\x00"]
texts = st.one_of(texts, st.lists(st.sampled_from(TOKENS), max_size=12).map(b"".join))
int16 = st.sampled_from([-1, 0, 1, 2, 3, 32767, -32768])
int32 = st.sampled_from([-2, -1, 0, 1, 4, 100, 2**31 - 1])


def i16(value: int) -> bytes:
    return struct.pack("!h", value)


def i32(value: int) -> bytes:
    return struct.pack("!i", value)


@st.composite
def parse_body(draw: Any) -> bytes:
    count = draw(int16)
    types = b"".join(i32(draw(int32)) for _ in range(draw(st.integers(0, 3))))
    return draw(names) + b"\x00" + draw(texts) + b"\x00" + i16(count) + types


@st.composite
def bind_body(draw: Any) -> bytes:
    body = draw(names) + b"\x00" + draw(names) + b"\x00"
    body += i16(draw(int16)) + b"".join(i16(draw(int16)) for _ in range(draw(st.integers(0, 2))))
    body += i16(draw(int16))
    for _ in range(draw(st.integers(0, 3))):
        length = draw(int32)
        body += i32(length) + draw(st.binary(max_size=8))
    return body + i16(draw(int16)) + b"".join(
        i16(draw(int16)) for _ in range(draw(st.integers(0, 2))))


@st.composite
def describe_body(draw: Any) -> bytes:
    target = draw(st.sampled_from([b"S", b"P", b"Z", b""]))
    return target + draw(names) + draw(st.sampled_from([b"\x00", b""]))


@st.composite
def message(draw: Any, mutate: bool = True) -> bytes:
    kind = draw(st.sampled_from("PPBBDDCESSHQQFdcf"))
    if kind == "P":
        body = draw(parse_body())
    elif kind == "B":
        body = draw(bind_body())
    elif kind in "DC":
        body = draw(describe_body())
    elif kind == "E":
        body = draw(names) + b"\x00" + i32(draw(int32))
    elif kind == "Q":
        body = draw(texts) + draw(st.sampled_from([b"\x00", b"", b"\x00\x00"]))
    else:
        body = draw(st.binary(max_size=12)) if kind in "Fdf" else b""
    mutation = draw(st.sampled_from(["none", "none", "cut", "pad", "flip"])) if mutate else ""
    if mutation == "cut" and body:
        body = body[:draw(st.integers(0, len(body) - 1))]
    elif mutation == "pad":
        body += draw(st.binary(min_size=1, max_size=6))
    elif mutation == "flip" and body:
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([draw(st.integers(0, 255))]) + body[at + 1:]
    return m.message(ord(kind), body)


def pieces(messages: list[bytes], data: st.DataObject) -> list[bytes]:
    """The messages as one stream, cut at up to four places hypothesis chooses."""
    stream = b"".join(messages)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(stream) - 1)),
                                          max_size=4))))
    out, start = [], 0
    for cut in [*cuts, len(stream)]:
        if cut > start:
            out.append(stream[start:cut])
            start = cut
    return out


def replies(data: bytes) -> list[str]:
    """Backend messages as their type letters, an ErrorResponse with its SQLSTATE; not the
    NoticeResponses (the pooler's own say a client keeps its server), nor the
    ParameterStatus messages (the pooler's SET of a client's parameters sends some)."""
    out, pos = [], 0
    while len(data) - pos >= 5:
        end = pos + 1 + int.from_bytes(data[pos + 1:pos + 5], "big")
        kind = chr(data[pos])
        if kind == "N" or kind == "S":
            pos = end
            continue
        if kind == "E":
            fields = {chunk[:1]: chunk[1:] for chunk in data[pos + 5:end].split(b"\x00")}
            kind = "E" + fields.get(b"C", b"?").decode()
        out.append(kind)
        pos = end
    return out


@st.composite
def copy_in(draw: Any) -> bytes:
    """A simple-Query COPY FROM STDIN and what a client sends for it: CopyData, perhaps a
    Flush or Sync among them (PostgreSQL ignores those during a COPY), then CopyDone or
    CopyFail."""
    during = [m.message(ord("d"), b"1\n"), m.message(ord("H")), m.sync()]
    inside = draw(st.lists(st.sampled_from(during), max_size=4))
    end = draw(st.sampled_from([m.message(ord("c")), m.message(ord("f"), b"stop\x00")]))
    return b"".join([m.query("COPY t FROM STDIN"), *inside, end])


def copied_as_clients_copy(messages: list[bytes]) -> bool:
    """Whether every COPY among `messages` is one `copy_in` made: what a client sends during
    one other than its data, a Flush or a Sync is a protocol error the pooler answers apart
    (its ledger doubts, and the server is closed), not as a direct connection would."""
    copy = m.query("COPY t FROM STDIN")
    return all(b"COPY" not in message or (message.startswith(copy) and message != copy)
               for message in messages)
