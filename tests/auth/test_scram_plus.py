"""SCRAM-SHA-256-PLUS (auth/scram.py): the pooler's server side against scramp's client, and
the pooler's client side (password and ClientKey) against its server side, with the
tls-server-end-point binding right, wrong, and missing."""

from __future__ import annotations

import base64

import pytest
from scramp import ScramClient

from pypool.auth.scram import (
    MECHANISM,
    MECHANISM_PLUS,
    ScramAuthError,
    ScramClientLogin,
    ScramDowngradeError,
    ScramMalformedError,
    ScramServerExchange,
    ScramVerifier,
)

pytestmark = pytest.mark.timeout(30)

USER, PASSWORD = "app", "app-secret"
VERIFIER = ScramVerifier.from_password(PASSWORD, 4096, b"0123456789abcdef")
BINDING = b"\x01" * 32  # the server certificate's hash
OTHER = b"\x02" * 32  # another certificate's


def server(plus: bool, binding: bytes | None = BINDING) -> ScramServerExchange:
    exchange = ScramServerExchange(VERIFIER, USER, binding)
    exchange.plus = plus
    return exchange


def run(exchange: ScramServerExchange, client: ScramClient) -> None:
    server_first = exchange.client_first(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    client.set_server_final(exchange.client_final(client.get_client_final().encode()).decode())


def test_plus_with_the_right_binding() -> None:
    exchange = server(plus=True)
    run(exchange, ScramClient([MECHANISM_PLUS], USER, PASSWORD,
                              channel_binding=("tls-server-end-point", BINDING)))
    assert exchange.client_key is not None


def test_plus_with_another_certificates_binding_fails() -> None:
    client = ScramClient([MECHANISM_PLUS], USER, PASSWORD,
                         channel_binding=("tls-server-end-point", OTHER))
    with pytest.raises(ScramMalformedError, match="^SCRAM channel binding check failed$"):
        run(server(plus=True), client)


def test_the_flag_must_match_the_mechanism() -> None:
    with pytest.raises(ScramMalformedError, match="does not include channel binding data"):
        server(plus=True).client_first(b"n,,n=,r=abcdef")
    with pytest.raises(ScramMalformedError, match="includes channel binding data"):
        server(plus=False).client_first(b"p=tls-server-end-point,,n=,r=abcdef")
    with pytest.raises(ScramMalformedError,
                       match='unsupported SCRAM channel-binding type "tls-unique"'):
        server(plus=True).client_first(b"p=tls-unique,,n=,r=abcdef")


def test_y_is_a_downgrade_where_binding_was_offered() -> None:
    with pytest.raises(ScramDowngradeError, match="negotiation error"):
        server(plus=False).client_first(b"y,,n=,r=abcdef")
    # Without TLS nothing was offered: `y` is the truth, and the login goes on.
    assert server(plus=False, binding=None).client_first(b"y,,n=,r=abcdef").startswith(b"r=")


def test_plain_scram_still_works_over_tls() -> None:
    run(server(plus=False), ScramClient([MECHANISM], USER, PASSWORD))


@pytest.mark.parametrize("with_password", [True, False])
def test_the_pooler_as_a_plus_client(with_password: bool) -> None:
    """Towards PostgreSQL: with the password (scramp) or the recovered ClientKey."""
    recovered = server(plus=False, binding=None)
    run(recovered, ScramClient([MECHANISM], USER, PASSWORD))
    secrets = ({"password": PASSWORD} if with_password else
               {"client_key": recovered.client_key, "server_key": VERIFIER.server_key})
    login = ScramClientLogin(USER, channel_binding=BINDING, **secrets)  # type: ignore[arg-type]
    assert login.mechanism == MECHANISM_PLUS
    first = login.client_first()
    assert first.startswith(b"p=tls-server-end-point,,")
    exchange = server(plus=True)
    final = login.server_first(exchange.client_first(first))
    cbind = base64.b64encode(b"p=tls-server-end-point,," + BINDING).decode()
    assert final.startswith(f"c={cbind},".encode())
    login.server_final(exchange.client_final(final))
    # The same login bound to another certificate than the server's own is refused.
    wrong = ScramClientLogin(USER, channel_binding=OTHER, **secrets)  # type: ignore[arg-type]
    exchange = server(plus=True)
    final = wrong.server_first(exchange.client_first(wrong.client_first()))
    with pytest.raises(ScramAuthError):
        exchange.client_final(final)
