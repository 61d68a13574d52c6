"""Which keys pypool takes and what each may be: the choices of the keyword-valued keys, the
keys PgBouncer has that pypool accepts and ignores, leaves at their default or applies only
at a restart, and `check_value`, the one range and choice check every section's values pass.

Tables and one check, no parsing: how a value is spelt is ini_values.py's, which key takes
which and the errors that name the file, line and key are settings.py's.
"""

from __future__ import annotations

from .ini_values import BOUNDS, MAX_INT, check_tls_protocols, parse_networks
from .pooling import policies

POOL_MODES = ("session", "transaction", "statement")
# What transaction mode does with session state (docs/session-state.md).
SESSION_STATE_POLICIES = ("follow", "reject", "ignore")
# [pgbouncer] listen_mode: how a LISTEN in transaction mode is heard (pooling/listening.py).
LISTEN_MODES = ("shared", "pin")
AUTH_TYPES = ("scram-sha-256", "md5", "plain", "trust", "any", "peer", "cert", "hba")
# PgBouncer's auth types that pypool refuses: pam needs a PAM stack.
UNSUPPORTED_AUTH_TYPES = ("pam",)

# The keys PgBouncer accepts that pypool parses but does not act on, accepted quietly.
ACCEPTED_UNUSED_KEYS = frozenset(
    """
    max_packet_size_warn conffile service_name job_name
    """.split()
)

# TLS (net/tls.py builds the contexts from these): the [pgbouncer] keys that configure it.
TLS_KEYS = (
    "client_tls_sslmode", "client_tls_key_file", "client_tls_cert_file", "client_tls_ca_file",
    "client_tls_protocols", "client_tls_ciphers", "client_tls13_ciphers",
    "client_tls_ecdhcurve", "client_tls_dheparams",
    "server_tls_sslmode", "server_tls_ca_file", "server_tls_key_file", "server_tls_cert_file",
    "server_tls_protocols", "server_tls_ciphers", "server_tls13_ciphers",
)
# libpq's sslmode values, weakest first (PgBouncer compares them by this order).
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


# [pgbouncer] keys with a field but no effect yet, and why: only their default is accepted.
NOT_YET_IMPLEMENTED: dict[str, str] = {
    "syslog": "pypool does not log to syslog; use logfile, or stderr under a log collector",
    "disable_pqexec": "pypool does not refuse the simple query protocol",
}

# [pgbouncer] keys that are fields (SHOW CONFIG lists them, SET takes them) but change
# nothing in pypool, and why that is right. docs/operating.md repeats this list.
NO_EFFECT: dict[str, str] = {
    "autodb_idle_timeout": "pools of `*` databases stay until their database is removed",
    "syslog_ident": "no syslog", "syslog_facility": "no syslog",
    "sbuf_loopcnt": "asyncio schedules the reads",
    "tcp_defer_accept": "asyncio accepts at once",
    "dns_max_ttl": "no DNS cache: every server connection resolves its host anew",
    "dns_nxdomain_ttl": "no DNS cache", "dns_zone_check_period": "no DNS cache",
    "resolv_conf": "the system resolver is used",
    # A buffer size, not a limit (max_packet_size is): PgBouncer takes messages larger than
    # it whole, so ignoring it changes no outcome. Many ini files set it.
    "pkt_buf": "pypool sizes its buffers itself",
}

# Keys that only take effect at start (PgBouncer's CF_NO_RELOAD, plus pypool's listeners):
# a reload keeps their old values and says so, and SET refuses them.
RESTART_ONLY_KEYS = frozenset(
    {"listen_addr", "listen_port", "pidfile", "logfile", "pkt_buf", "so_reuseport", "workers",
     "track_extra_parameters", "metrics_addr", "metrics_port", "unix_socket_dir",
     "unix_socket_mode", "unix_socket_group", "listen_backlog", "user", "peer_id"}
)

# [databases] load_balance_hosts: how a host list is tried.
LOAD_BALANCE_HOSTS = ("round-robin", "disable")


def check_value(key: str, value: object) -> None:
    """Raise ValueError if `value` is out of `key`'s range or choices (any section)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        low, high = BOUNDS.get(key, (0, MAX_INT))
        if not low <= value <= high:
            # Name the bound crossed (a key without an upper bound of its own has C's).
            allowed = (f"between {low} and {high}" if high != MAX_INT
                       else f">= {low}" if value < low else f"<= {high}")
            raise ValueError(f"must be {allowed}, not {value}")
    elif key == "pool_mode" and value not in POOL_MODES:
        raise ValueError(f"must be one of {', '.join(POOL_MODES)}, not {value!r}")
    elif key == "session_state" and value not in SESSION_STATE_POLICIES:
        raise ValueError(f"must be one of {', '.join(SESSION_STATE_POLICIES)}, not {value!r}")
    elif key == "listen_mode" and value not in LISTEN_MODES:
        raise ValueError(f"must be one of {', '.join(LISTEN_MODES)}, not {value!r}")
    elif key == "queue_policy":
        policies.queue_factory(str(value))
    elif key == "server_policy":
        policies.server_factory(str(value))
    elif key == "queue_priority":
        policies.parse_priority(str(value))
    elif key == "auth_type" and value not in AUTH_TYPES:
        unsupported = " (not supported yet)" if value in UNSUPPORTED_AUTH_TYPES else ""
        raise ValueError(f"must be one of {', '.join(AUTH_TYPES)}, not {value!r}{unsupported}")
    elif key.endswith("_sslmode") and value not in SSLMODES:
        raise ValueError(f"must be one of {', '.join(SSLMODES)}, not {value!r}")
    elif key.endswith("_tls_protocols"):
        check_tls_protocols(str(value))
    elif key == "proxy_protocol_sources" and isinstance(value, tuple):
        parse_networks(value)
