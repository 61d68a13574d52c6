"""How a PgBouncer ini spells a value: integers, file modes, durations, booleans, lists,
libpq connection strings and libtls protocol lists, and the bounds of the numeric keys.

Pure functions from text to a value, raising ValueError with what is wrong; settings.py says
which key takes which, and names the file, line and key in its errors.
"""

from __future__ import annotations

import re
from ipaddress import IPv4Network, IPv6Network, ip_network

# What `*_tls_protocols` may name (libtls's syntax): keywords or a list of versions.
TLS_PROTOCOL_WORDS = ("all", "secure", "default", "legacy")
TLS_VERSIONS = ("tlsv1.0", "tlsv1.1", "tlsv1.2", "tlsv1.3")


def check_tls_protocols(text: str) -> None:
    """Raise ValueError unless `text` is libtls's protocol syntax: `secure`, `all`, ... or a
    list of versions separated by commas or colons, each may be negated with `!`."""
    for item in re.split(r"[,:]", text.lower()):
        word = item.strip().lstrip("!")
        if word and word not in TLS_PROTOCOL_WORDS and word not in TLS_VERSIONS:
            raise ValueError(f"unknown TLS protocol {item.strip()!r} (one of "
                             f"{', '.join(TLS_PROTOCOL_WORDS + TLS_VERSIONS)})")


MAX_INT = 2147483647  # PgBouncer keeps integer settings in a C int
# Inclusive bounds of numeric keys, in [pgbouncer], [databases] and [users] alike. Any other
# integer must be in 0..MAX_INT, and every time >= 0 (parse_duration has no sign).
BOUNDS: dict[str, tuple[int, int]] = {
    "listen_port": (1, 65535),
    "port": (1, 65535),
    "metrics_port": (0, 65535),
    "max_client_conn": (1, MAX_INT),
    "scram_iterations": (1, MAX_INT),
    "workers": (1, 256),  # a cancel key has one byte for the worker (protocol/cancel_key.py)
    "max_packet_size": (1024, MAX_INT),
    "pkt_buf": (1, MAX_INT),  # PgBouncer's own suite runs with 75
    "unix_socket_mode": (0, 0o7777),
}


class NotSupported(ValueError):
    """A key pypool parses but does not implement, set to a value that would need it."""


def parse_int(text: str) -> int:
    if not re.fullmatch(r"\s*[-+]?[0-9]+\s*", text):
        raise ValueError(f"not an integer: {text!r}")
    return int(text)


def parse_mode(text: str) -> int:
    """A file mode as PgBouncer reads one (C's strtol, base 0): `0777` is octal, `0x1ff`
    hexadecimal, `511` decimal."""
    stripped = text.strip()
    if re.fullmatch(r"0[0-7]*", stripped):
        return int(stripped, 8)
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", stripped):
        return int(stripped, 16)
    if re.fullmatch(r"[1-9][0-9]*", stripped):
        return int(stripped)
    raise ValueError(f"not a file mode: {text!r} (write it in octal, as 0777)")


def parse_duration(text: str) -> float:
    """Seconds from PgBouncer's time syntax: `15`, `0.5`, `500ms`, `2min`, `1h`."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(us|ms|s|min|h|d)?\s*", text)
    if not match and text.strip().startswith("-"):
        raise ValueError(f"must be >= 0, not {text.strip()}")
    if not match:
        raise ValueError(f"not a duration: {text!r}")
    value = float(match.group(1))
    scale = {None: 1.0, "us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
    return value * scale[match.group(2)]


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "yes", "on", "true"):
        return True
    if lowered in ("0", "no", "off", "false"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def parse_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def parse_networks(items: tuple[str, ...]) -> tuple[IPv4Network | IPv6Network, ...]:
    """Addresses and networks (`10.0.0.0/8`, `192.0.2.7`, `2001:db8::/32`) as ipaddress
    networks; a bare address is a network of one. Host bits set are allowed (`10.1.2.3/8`
    is 10.0.0.0/8), as in pg_hba.conf. ValueError names the item that is neither."""
    networks = []
    for item in items:
        try:
            networks.append(ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"not an IP address or network: {item!r}") from None
    return tuple(networks)


def parse_connstring(text: str) -> dict[str, str]:
    """libpq-style `key=value key2='quoted value'` into a dict."""
    result: dict[str, str] = {}
    pos, n = 0, len(text)
    while pos < n:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            break
        eq = text.find("=", pos)
        if eq < 0:
            raise ValueError(f"expected key=value at {text[pos:]!r}")
        key = text[pos:eq].strip().lower()
        pos = eq + 1
        while pos < n and text[pos].isspace():
            pos += 1
        if pos < n and text[pos] == "'":
            pos += 1
            value = []
            while pos < n:
                ch = text[pos]
                if ch == "\\" and pos + 1 < n:
                    value.append(text[pos + 1])
                    pos += 2
                    continue
                if ch == "'":
                    if pos + 1 < n and text[pos + 1] == "'":
                        value.append("'")
                        pos += 2
                        continue
                    pos += 1
                    break
                value.append(ch)
                pos += 1
            else:
                raise ValueError("unterminated quoted value")
            result[key] = "".join(value)
        else:
            start = pos
            while pos < n and not text[pos].isspace():
                pos += 1
            result[key] = text[start:pos]
    return result
