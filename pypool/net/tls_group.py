"""The key-exchange group a TLS handshake used, for the `tls` column of SHOW CLIENTS.

PgBouncer shows it (`TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519`), and Python's ssl module
does not say it (there is no `SSLObject.group()` before Python 3.15). OpenSSL does, through
`SSL_get_negotiated_group`, a macro for `SSL_ctrl(ssl, SSL_CTRL_GET_NEGOTIATED_GROUP, 0,
NULL)`. This module reaches the `SSL *` behind an `ssl.SSLObject` with ctypes, calling into the
very libssl the `_ssl` module is linked with.

It reads one pointer out of CPython's `_ssl._SSLSocket` object, whose layout (the object
header, then the socket weakref, the `SSL *`, the context) has been the same since Python 3.7.
The read is checked before anything is called: the word after the `SSL *` must be the
address of the object's own context, and OpenSSL must report the protocol version the ssl
module reports. When either check fails, or anything else goes wrong, the answer is "" and
the column simply has no ECDH part. Used once per TLS connection, never on the hot path.
"""

from __future__ import annotations

import ctypes
import logging
import ssl
from typing import Any

log = logging.getLogger("pypool.tls")

_SSL_CTRL_GET_NEGOTIATED_GROUP = 134
_WORD = ctypes.sizeof(ctypes.c_void_p)
_TLS13_GROUP_FLAG = 0x01000000  # OpenSSL 3 marks groups it has no NID for with this bit


def _load() -> Any:
    try:
        import _ssl

        lib = ctypes.CDLL(_ssl.__file__)
        lib.SSL_ctrl.restype = ctypes.c_long
        lib.SSL_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
        lib.SSL_get_version.restype = ctypes.c_char_p
        lib.SSL_get_version.argtypes = [ctypes.c_void_p]
        lib.OBJ_nid2sn.restype = ctypes.c_char_p
        lib.OBJ_nid2sn.argtypes = [ctypes.c_int]
        return lib
    except (ImportError, OSError, AttributeError) as exc:
        log.debug("the TLS group cannot be read here: %s", exc)
        return None


_LIB = _load()


def negotiated_group(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> str:
    """OpenSSL's short name of the group the finished handshake used ("X25519",
    "prime256v1", ...); "" when it cannot be told."""
    method = getattr(ssl_object, "group", None)
    if callable(method):  # Python 3.15+
        return str(method() or "")
    if _LIB is None:
        return ""
    inner = getattr(ssl_object, "_sslobj", ssl_object)
    try:
        version = inner.version()
        if not version:
            return ""  # no handshake yet
        # After the object header (reference count, type): the socket weakref, SSL *, context.
        words = (ctypes.c_void_p * 3).from_address(id(inner) + 2 * _WORD)
        handle, context = words[1], words[2]
        if not handle or context != id(inner.context):
            return ""
        reported = _LIB.SSL_get_version(handle)
        if reported is None or reported.decode() != version:
            return ""
        nid = int(_LIB.SSL_ctrl(handle, _SSL_CTRL_GET_NEGOTIATED_GROUP, 0, None))
        if nid <= 0 or nid & _TLS13_GROUP_FLAG:
            return ""
        name = _LIB.OBJ_nid2sn(nid)
        return name.decode() if name else ""
    except Exception as exc:  # noqa: BLE001 - a column's detail, never a failed login
        log.debug("the TLS group could not be read: %s", exc)
        return ""
