"""TLS 1.3's cipher suites, narrowed on an `ssl.SSLContext`: `client_tls13_ciphers` and
`server_tls13_ciphers`, which Python's ssl module cannot set.

`SSLContext.set_ciphers` covers TLS 1.2 and below only; OpenSSL's TLS 1.3 list is set with
`SSL_CTX_set_ciphersuites`, which the module does not expose. This is the one place pypool
reaches past it, and it does so only where it can check what it reaches:

- the `SSL_CTX *` under a context is the first field after the object header of CPython's
  `PySSLContext` (so in every CPython 3 release to date);
- the function comes from the OpenSSL the `_ssl` module itself is linked with (dlsym on
  that module's handle searches its dependencies), so both sides agree on the `SSL_CTX`;
- before anything is set, the pointer is checked: OpenSSL must report the same options
  for it as the ssl module does for the context, changed once to a value of the check's
  own (the `ssl` module reads `options` through OpenSSL from the same pointer).

Anything else (another Python, a layout that does not check out, an OpenSSL without the
function) and `restrict` returns False: the caller refuses the key as pypool did before, with
the reason. Never here: which suites a key allows (net/tls.py).
"""

from __future__ import annotations

import ctypes
import logging
import platform
import ssl
from collections.abc import Callable
from typing import Any

log = logging.getLogger("pypool")


class _OpenSSL:
    """The two OpenSSL functions used here, from the library the ssl module is linked with;
    None when they cannot be had."""

    def __init__(self) -> None:
        self.set_ciphersuites: Callable[..., Any] | None = None
        self.get_options: Callable[..., Any] | None = None
        if platform.python_implementation() != "CPython":
            return
        try:
            import _ssl

            lib = ctypes.CDLL(_ssl.__file__)
            set_suites = lib.SSL_CTX_set_ciphersuites
            get_options = lib.SSL_CTX_get_options
        except (AttributeError, OSError):
            return
        set_suites.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        set_suites.restype = ctypes.c_int
        get_options.argtypes = [ctypes.c_void_p]
        get_options.restype = ctypes.c_uint64
        self.set_ciphersuites, self.get_options = set_suites, get_options


_openssl: _OpenSSL | None = None


def _library() -> _OpenSSL:
    global _openssl
    if _openssl is None:
        _openssl = _OpenSSL()
    return _openssl


def _ssl_ctx(ctx: ssl.SSLContext, get_options: Callable[..., Any]) -> int | None:
    """The `SSL_CTX *` under `ctx`, or None when what sits where it should does not act as
    `ctx`'s own: OpenSSL must read back an option the ssl module just set."""
    pointer = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not pointer:
        return None
    saved = ctx.options
    probe = ssl.OP_NO_TICKET
    try:
        for options in (saved | probe, saved & ~probe):
            ctx.options = options  # type: ignore[assignment]  # an int, as ssl reads it back
            if int(get_options(pointer)) != int(ctx.options):
                return None
    finally:
        ctx.options = saved
    return pointer


def restrict(ctx: ssl.SSLContext, suites: list[str]) -> bool:
    """Allow only `suites` (OpenSSL's TLS 1.3 names, in order of preference) on `ctx`;
    False when it cannot be done here (see the module's docstring), or OpenSSL refused."""
    openssl = _library()
    if openssl.set_ciphersuites is None or openssl.get_options is None:
        return False
    pointer = _ssl_ctx(ctx, openssl.get_options)
    if pointer is None:
        log.warning("TLS 1.3 cipher suites: this Python's ssl contexts are not as expected")
        return False
    return bool(openssl.set_ciphersuites(pointer, ":".join(suites).encode()))
