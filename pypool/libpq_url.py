"""A libpq connection URL (`postgresql://user:secret@host:port/db?sslmode=require`), read as
the quick start's one database: hosts, port, names, and the URL parameters that have an ini
key of their own. Pure: text in, a `LibpqUrl` out, or ValueError saying what is wrong.

libpq takes dozens of parameters; the quick start honours the ones below and refuses every
other by name, since a parameter silently dropped (`sslmode=require` over plaintext) is worse
than a start that stops and says so. For the rest, write an ini.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

SCHEMES = ("postgres", "postgresql")
# URL parameter -> the [pgbouncer] key it sets.
POOLER_KEYS = {
    "sslmode": "server_tls_sslmode",
    "sslrootcert": "server_tls_ca_file",
    "sslcert": "server_tls_cert_file",
    "sslkey": "server_tls_key_file",
    "connect_timeout": "server_connect_timeout",
}
# URL parameter -> the [databases] entry's key it sets.
DATABASE_KEYS = {
    "application_name": "application_name",
    "load_balance_hosts": "load_balance_hosts",
}
# Parameters that name what the URL's own parts name.
OWN_PARTS = ("host", "hostaddr", "port", "dbname", "user", "password")


@dataclass
class LibpqUrl:
    hosts: list[str]
    port: int
    dbname: str
    user: str
    password: str
    pooler_keys: dict[str, str] = field(default_factory=dict)  # [pgbouncer] key -> text
    database_keys: dict[str, str] = field(default_factory=dict)  # entry key -> text


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"invalid port {text!r} (a number from 1 to 65535)")
    return int(text)


def _host_and_port(item: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[::1]:port` (percent-decoded)."""
    if item.startswith("["):
        close = item.find("]")
        if close < 0:
            raise ValueError(f"unclosed [ in host {item!r}")
        host, rest = item[1:close], item[close + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"invalid host {item!r}")
        return host, _port(rest[1:]) if rest else None
    host, colon, port = item.partition(":")
    return unquote(host), _port(port) if colon else None


def parse_libpq_url(url: str) -> LibpqUrl:
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError("not a postgresql:// URL")
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if not at:
        userinfo, hostlist = "", parts.netloc
    user, colon, password = userinfo.partition(":")
    hosts: list[str] = []
    ports: set[int] = set()
    for item in hostlist.split(",") if hostlist else []:
        host, port = _host_and_port(item)
        if host:
            hosts.append(host)
        if port is not None:
            ports.add(port)
    found = LibpqUrl(hosts=hosts, port=5432, dbname=unquote(parts.path.lstrip("/")),
                     user=unquote(user), password=unquote(password) if colon else "")
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in POOLER_KEYS:
            found.pooler_keys[POOLER_KEYS[name]] = value
        elif name in DATABASE_KEYS:
            found.database_keys[DATABASE_KEYS[name]] = value
        elif name in ("host", "hostaddr"):
            found.hosts = [h for h in value.split(",") if h]
        elif name == "port":
            ports = {_port(p) for p in value.split(",") if p}
        elif name == "dbname":
            found.dbname = value
        elif name == "user":
            found.user = value
        elif name == "password":
            found.password = value
        else:
            raise ValueError(f"URL parameter {name!r} is not taken by the quick start "
                             f"(it takes {', '.join([*POOLER_KEYS, *DATABASE_KEYS, *OWN_PARTS])};"
                             " write an ini for the rest)")
    if len(ports) > 1:
        raise ValueError(f"several hosts with different ports ({', '.join(map(str, sorted(ports)))}"
                         "): a host list shares one port")
    if ports:
        found.port = ports.pop()
    if any(host.startswith("/") for host in found.hosts) and len(found.hosts) > 1:
        raise ValueError("a unix socket directory cannot be part of a host list")
    return found
