"""net/tls_group.py: the key-exchange group of a finished handshake, read from OpenSSL."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from pypool.net.tls_group import negotiated_group

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls-group")
    key, crt = folder / "k.pem", folder / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True)
    return key, crt


def handshake(cert: tuple[Path, Path], curve: str = "") -> tuple[str, str]:
    """The group each side reads after one handshake over a loopback socket."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(cert[1]), str(cert[0]))
    if curve:
        server.set_ecdh_curve(curve)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    seen: list[str] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def serve() -> None:
            conn, _ = listener.accept()
            with server.wrap_socket(conn, server_side=True) as tls:
                seen.append(negotiated_group(tls))
                tls.recv(1)

        thread = threading.Thread(target=serve)
        thread.start()
        with client.wrap_socket(socket.create_connection(listener.getsockname())) as tls:
            mine = negotiated_group(tls)
            tls.sendall(b"x")
        thread.join(10)
    return mine, seen[0]


def test_both_sides_read_the_group_of_the_handshake(cert: tuple[Path, Path]) -> None:
    mine, theirs = handshake(cert)
    assert mine and mine == theirs  # X25519 with today's OpenSSL defaults


def test_a_single_curve_is_the_one_read(cert: tuple[Path, Path]) -> None:
    assert handshake(cert, "prime256v1") == ("prime256v1", "prime256v1")


def test_nothing_before_the_handshake() -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    unfinished = context.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO())
    assert negotiated_group(unfinished) == ""
