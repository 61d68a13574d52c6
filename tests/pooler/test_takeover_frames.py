"""The takeover's wire (pooler/takeover.py): frames with descriptors, over a socketpair, and
where the takeover socket lives."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from pypool.net.unix_socket import MAX_SOCKET_PATH
from pypool.pooler.takeover import TakeoverError, recv_frame, send_frame, takeover_address

pytestmark = pytest.mark.timeout(10)


def test_a_frame_carries_its_json_and_its_descriptors() -> None:
    left, right = socket.socketpair()
    read_end, write_end = os.pipe()
    try:
        send_frame(left, {"client": {"user": "app", "params": {"TimeZone": "UTC"}}}, [write_end])
        send_frame(left, {"done": True})
        body, fds = recv_frame(right)
        assert body == {"client": {"user": "app", "params": {"TimeZone": "UTC"}}}
        assert len(fds) == 1
        os.write(fds[0], b"through the passed descriptor")
        os.close(fds[0])
        assert os.read(read_end, 100) == b"through the passed descriptor"
        assert recv_frame(right) == ({"done": True}, [])
    finally:
        for sock in (left, right):
            sock.close()
        os.close(read_end)
        os.close(write_end)


def test_frames_larger_than_the_socket_buffer_arrive_whole() -> None:
    left, right = socket.socketpair()
    big = {"statements": ["x" * 1000] * 2000}  # 2 MB of JSON, one descriptor with it
    read_end, write_end = os.pipe()
    sender = threading.Thread(target=send_frame, args=(left, big, [write_end]))
    sender.start()
    try:
        body, fds = recv_frame(right)
        sender.join(5)
        assert body == big
        assert len(fds) == 1
        os.close(fds[0])
    finally:
        for sock in (left, right):
            sock.close()
        os.close(read_end)
        os.close(write_end)


def test_a_closed_peer_or_a_bad_header_is_an_error() -> None:
    left, right = socket.socketpair()
    left.close()
    with pytest.raises(TakeoverError, match="closed"):
        recv_frame(right)
    right.close()
    left, right = socket.socketpair()
    try:
        left.sendall((1 << 30).to_bytes(4, "big") + (0).to_bytes(4, "big"))
        with pytest.raises(TakeoverError, match="bad takeover frame"):
            recv_frame(right)
    finally:
        left.close()
        right.close()


def test_the_takeover_socket_sits_beside_the_unix_socket() -> None:
    assert takeover_address("/tmp", 6432) == "/tmp/.s.PGSQL.6432.takeover"


def test_a_directory_too_long_for_the_path_gets_an_abstract_socket() -> None:
    # The unix socket's own path fits; its takeover path, 9 bytes longer, would not.
    directory = "/tmp/" + "d" * (MAX_SOCKET_PATH - len("/tmp/") - len("/.s.PGSQL.6432") - 2)
    address = takeover_address(directory, 6432)
    assert isinstance(address, bytes) and address.startswith(b"\0pypool-takeover-")
    assert address == takeover_address(directory, 6432)  # both processes name it alike
    assert address != takeover_address(directory, 6433)
