"""Configuration: a PgBouncer-format ini (or a DATABASE_URL) parsed once into frozen dataclasses.

Every supported key and its default lives in `PoolerSettings` below, in one place; units
follow PgBouncer (times in seconds, fractions allowed, or with a unit suffix such as `500ms`).
Every value, from the ini, a RELOAD or the console's SET, goes through one parser and checker
(`parse_value`: type, range, choices), so SET cannot install a value the ini would refuse.
Errors name the file, the line and the key.

An unknown key is a warning, never a crash, and PgBouncer keys that change nothing in pypool's
place (DNS, syslog, ...) are accepted, with a warning when set away from their default. Keys
whose being ignored would mislead the operator are refused unless set to the value that
leaves them off: the few `NOT_YET_IMPLEMENTED` keys. The TLS keys are checked here for their
syntax; whether their files and cipher lists make a working context is net/tls.py's to say.
How each kind of value is spelt (durations, booleans, connection strings) is ini_values.py's;
the keys' choices, the accepted-but-ignored and restart-only keys and the range and choice
check are ini_keys.py's.
"""

from __future__ import annotations

import configparser
import dataclasses
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from .ini_keys import ACCEPTED_UNUSED_KEYS as ACCEPTED_UNUSED_KEYS
from .ini_keys import AUTH_TYPES as AUTH_TYPES
from .ini_keys import LOAD_BALANCE_HOSTS as LOAD_BALANCE_HOSTS
from .ini_keys import NO_EFFECT as NO_EFFECT
from .ini_keys import NOT_YET_IMPLEMENTED as NOT_YET_IMPLEMENTED
from .ini_keys import POOL_MODES as POOL_MODES
from .ini_keys import RESTART_ONLY_KEYS as RESTART_ONLY_KEYS
from .ini_keys import SESSION_STATE_POLICIES as SESSION_STATE_POLICIES
from .ini_keys import SSLMODES as SSLMODES
from .ini_keys import TLS_KEYS as TLS_KEYS
from .ini_keys import UNSUPPORTED_AUTH_TYPES as UNSUPPORTED_AUTH_TYPES
from .ini_keys import check_value
from .ini_values import BOUNDS as BOUNDS
from .ini_values import MAX_INT as MAX_INT
from .ini_values import TLS_PROTOCOL_WORDS as TLS_PROTOCOL_WORDS
from .ini_values import TLS_VERSIONS as TLS_VERSIONS
from .ini_values import NotSupported as NotSupported
from .ini_values import check_tls_protocols as check_tls_protocols
from .ini_values import parse_bool as parse_bool
from .ini_values import parse_connstring as parse_connstring
from .ini_values import parse_duration as parse_duration
from .ini_values import parse_int as parse_int
from .ini_values import parse_list as parse_list
from .ini_values import parse_mode as parse_mode
from .libpq_url import parse_libpq_url

log = logging.getLogger("pypool.settings")


class SettingsError(Exception):
    """The configuration cannot be used; the message names the file, line and key."""


@dataclass(frozen=True)
class PoolerSettings:
    """The [pgbouncer] (or [pypool]) section. Field names are the ini keys."""

    listen_addr: str = "127.0.0.1"
    listen_port: int = 6432
    # `<unix_socket_dir>/.s.PGSQL.<listen_port>` and its `.lock` (net/unix_socket.py);
    # empty: no unix socket. The mode is written in octal, as PgBouncer reads it.
    unix_socket_dir: str = "/tmp"
    unix_socket_mode: int = 0o777
    unix_socket_group: str = ""
    pool_mode: str = "session"
    default_pool_size: int = 20
    min_pool_size: int = 0
    reserve_pool_size: int = 0
    reserve_pool_timeout: float = 5.0
    max_client_conn: int = 100
    max_db_connections: int = 0
    max_user_connections: int = 0
    # Clients per database and per user, counted from the login attempt (pooler/client_limits).
    max_db_client_connections: int = 0
    max_user_client_connections: int = 0
    max_prepared_statements: int = 200
    max_client_prepared_statements: int = 10000
    pipeline_depth: int = 0
    session_state: str = "follow"
    # A client's LISTEN in transaction mode: "shared" (the pool's listening connection hears
    # it, no server is pinned; pooling/listening.py) or "pin" (its server stays, as before).
    listen_mode: str = "shared"
    query_wait_timeout: float = 120.0
    query_wait_notify: float = 5.0
    query_timeout: float = 0.0
    idle_transaction_timeout: float = 0.0
    transaction_timeout: float = 0.0
    client_idle_timeout: float = 0.0
    client_login_timeout: float = 60.0
    # PgBouncer 1.26: a NOTICE each client gets in its welcome (empty: none), to tell people
    # they are talking to a pooler.
    login_notify_message: str = ""
    # PgBouncer 1.26: a pool with no client and no server for this long is forgotten (its
    # SHOW POOLS line and its counters go with it); 0 keeps every pool.
    pool_idle_timeout: float = 0.0
    server_lifetime: float = 3600.0
    server_idle_timeout: float = 600.0
    server_connect_timeout: float = 15.0
    server_login_retry: float = 15.0
    server_reset_query: str = "DISCARD ALL"
    server_reset_query_always: bool = False
    server_check_query: str = "<empty>"  # PgBouncer 1.25's: an empty query; "" turns it off
    server_check_delay: float = 30.0
    auth_type: str = "md5"
    auth_file: str = ""
    # PgBouncer 1.25: PBKDF2 iterations of the SCRAM verifier pypool makes from a plaintext
    # secret (auth_file, [databases] password), and of an unknown user's mock one.
    scram_iterations: int = 4096
    # auth_type = hba: PgBouncer's pg_hba.conf subset and its ident maps (auth/hba.py).
    auth_hba_file: str = ""
    auth_ident_file: str = ""
    # The [databases] entry whose auth_user runs auth_query, when the client's own has none.
    auth_dbname: str = ""
    auth_user: str = ""
    auth_query: str = (
        "SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword END "
        "FROM pg_authid WHERE rolname=$1 AND rolcanlogin"
    )
    admin_users: tuple[str, ...] = ()
    stats_users: tuple[str, ...] = ()
    ignore_startup_parameters: tuple[str, ...] = ()
    track_extra_parameters: tuple[str, ...] = ()
    application_name_add_host: bool = False
    # pypool's own (PgBouncer has no PROXY protocol, its issue #241): the load balancers,
    # as addresses and networks, whose TCP connections open with a PROXY protocol header
    # (v1 or v2) naming the real client; from them the header is required, from anyone
    # else refused. Empty: off, no connection is read for a header. Taken at each new
    # connection, so RELOAD and SET change it for the next ones (docs/operating.md).
    proxy_protocol_sources: tuple[str, ...] = ()
    max_packet_size: int = 2147483647
    pkt_buf: int = 4096
    so_reuseport: bool = False
    workers: int = 1
    logfile: str = ""
    pidfile: str = ""
    log_connections: bool = True
    log_disconnections: bool = True
    log_pooler_errors: bool = True
    log_stats: bool = True
    stats_period: float = 60.0
    metrics_addr: str = ""
    metrics_port: int = 0
    shutdown_timeout: float = 0.0
    # pypool's own: SIGINT (and SHUTDOWN WAIT_FOR_SERVERS) drains, as `SHUTDOWN DRAIN` does
    # (docs/operating.md, Draining); 0, the default, keeps PgBouncer's SIGINT.
    shutdown_drain: bool = False
    cancel_wait_timeout: float = 10.0
    # TLS (net/tls.py, docs/tls.md), PgBouncer's defaults: towards servers prefer (TLS when
    # the server offers it, unverified), towards clients off.
    client_tls_sslmode: str = "disable"
    client_tls_key_file: str = ""
    client_tls_cert_file: str = ""
    client_tls_ca_file: str = ""
    client_tls_protocols: str = "secure"
    client_tls_ciphers: str = "default"
    client_tls13_ciphers: str = ""
    client_tls_ecdhcurve: str = "auto"
    client_tls_dheparams: str = "auto"
    server_tls_sslmode: str = "prefer"
    server_tls_ca_file: str = ""
    server_tls_key_file: str = ""
    server_tls_cert_file: str = ""
    server_tls_protocols: str = "secure"
    server_tls_ciphers: str = "default"
    server_tls13_ciphers: str = ""
    # Research (docs/research.md): one JSON line per transaction and per failed wait
    # (observe/txlog.py); empty: off. Reopened on SIGHUP, for log rotation.
    transaction_log: str = ""
    # Research (docs/research.md): the protocol trace of every connection, one line per
    # message, to the `pypool.trace` logger (observe/trace.py). Also `pypool --trace`.
    trace: bool = False
    # Which waiting client is served next and which idle server is handed out
    # (pooling/policies.py): a built-in name or module:Class.
    queue_policy: str = "fifo"
    queue_priority: str = ""  # queue_policy = priority: "application_name: web=10, batch=-5"
    server_policy: str = "lifo"
    # PgBouncer keys with nothing (or nothing yet) to do in pypool's place. They are fields so
    # that SHOW CONFIG lists them and SET takes them; NO_EFFECT says what each one does here.
    server_round_robin: bool = False
    server_fast_close: bool = False
    suspend_timeout: float = 10.0
    autodb_idle_timeout: float = 3600.0
    disable_pqexec: bool = False
    verbose: int = 0
    user: str = ""
    peer_id: int = 0
    syslog: bool = False
    syslog_ident: str = "pgbouncer"
    syslog_facility: str = "daemon"
    listen_backlog: int = 128
    sbuf_loopcnt: int = 5
    tcp_defer_accept: int = 45
    tcp_socket_buffer: int = 0
    tcp_keepalive: bool = True
    tcp_keepcnt: int = 0
    tcp_keepidle: int = 0
    tcp_keepintvl: int = 0
    tcp_user_timeout: int = 0
    dns_max_ttl: float = 15.0
    dns_nxdomain_ttl: float = 15.0
    dns_zone_check_period: float = 0.0
    resolv_conf: str = ""




@dataclass(frozen=True)
class DatabaseEntry:
    """One line of [databases]: where the real database is and how its pool is sized."""

    name: str
    host: str = "127.0.0.1"
    port: int = 5432
    dbname: str = ""
    user: str = ""
    password: str = ""
    pool_size: int | None = None
    min_pool_size: int | None = None
    reserve_pool_size: int | None = None
    max_db_connections: int | None = None
    pool_mode: str | None = None
    max_db_client_connections: int | None = None
    server_lifetime: float | None = None
    query_wait_timeout: float | None = None  # PgBouncer 1.26: per database, then per user
    # host lists (host=a,b): round-robin starts each new server at the next host; disable
    # tries them in order, the first that answers wins.
    load_balance_hosts: str = "round-robin"
    session_state: str | None = None
    auth_user: str = ""
    auth_query: str = ""
    auth_dbname: str = ""
    application_name: str = ""
    client_encoding: str = ""
    datestyle: str = ""
    timezone: str = ""
    connect_query: str = ""

    @property
    def server_dbname(self) -> str:
        return self.dbname or self.name

    @property
    def hosts(self) -> tuple[str, ...]:
        """`host=a,b,c`: the servers to try, in order."""
        return tuple(h.strip() for h in self.host.split(",") if h.strip()) or ("127.0.0.1",)


@dataclass(frozen=True)
class UserEntry:
    """One line of [users]: per-user overrides."""

    name: str
    pool_mode: str | None = None
    pool_size: int | None = None
    reserve_pool_size: int | None = None
    max_user_connections: int | None = None
    max_user_client_connections: int | None = None
    transaction_timeout: float | None = None
    query_timeout: float | None = None
    idle_transaction_timeout: float | None = None
    client_idle_timeout: float | None = None
    query_wait_timeout: float | None = None  # PgBouncer 1.26's, over the database's


@dataclass(frozen=True)
class PeerEntry:
    """One line of [peers]: another pooler (PgBouncer or pypool) behind the same load
    balancer, to which a CancelRequest carrying its `peer_id` is forwarded (pooler/peers.py).
    `host` is a name, an address, or a unix socket directory (a path)."""

    peer_id: int
    host: str
    port: int = 6432
    pool_size: int = -1  # at most this many cancels in flight to it; -1: default_pool_size


@dataclass(frozen=True)
class Settings:
    pooler: PoolerSettings = field(default_factory=PoolerSettings)
    databases: dict[str, DatabaseEntry] = field(default_factory=dict)
    users: dict[str, UserEntry] = field(default_factory=dict)
    peers: dict[int, PeerEntry] = field(default_factory=dict)  # peer_id -> its entry
    path: str = ""
    # Users known without an auth_file (the quick start's URL): name -> plaintext secret.
    inline_users: dict[str, str] = field(default_factory=dict)

    def database_client_cap(self, name: str) -> int:
        """max_db_client_connections for database `name` ([databases], else [pgbouncer]);
        0: no cap. The console database has the [pgbouncer] one."""
        entry = self.database(name) if name not in ("pgbouncer", "pypool") else None
        if entry is not None and entry.max_db_client_connections:
            return entry.max_db_client_connections
        return self.pooler.max_db_client_connections

    def user_client_cap(self, name: str) -> int:
        """max_user_client_connections for user `name` ([users], else [pgbouncer])."""
        entry = self.users.get(name)
        if entry is not None and entry.max_user_client_connections:
            return entry.max_user_client_connections
        return self.pooler.max_user_client_connections

    def database(self, name: str) -> DatabaseEntry | None:
        """The [databases] entry for `name`, falling back to the `*` entry."""
        entry = self.databases.get(name)
        if entry is None and "*" in self.databases:
            entry = dataclasses.replace(self.databases["*"], name=name)
        return entry


_INT_DB_KEYS = ("pool_size", "min_pool_size", "reserve_pool_size", "max_db_connections",
                "max_db_client_connections")
_USER_KEYS: dict[str, str] = {  # [users] key -> its kind
    "pool_mode": "str", "pool_size": "int", "reserve_pool_size": "int",
    "max_user_connections": "int", "max_user_client_connections": "int",
    "transaction_timeout": "duration", "query_timeout": "duration",
    "idle_transaction_timeout": "duration", "client_idle_timeout": "duration",
    "query_wait_timeout": "duration",
}


# --- one value: parse and check -------------------------------------------------------------

_FIELDS = {f.name: f for f in dataclasses.fields(PoolerSettings)}
_DEFAULTS = PoolerSettings()



def parse_value(key: str, text: str) -> object:
    """The value of [pgbouncer] key `key` (a `PoolerSettings` field, lower case) from its ini
    text, checked as the ini, RELOAD and SET all check it. Raises ValueError saying what is
    wrong (NotSupported for a key or value pypool does not implement)."""
    field_type = str(_FIELDS[key].type)
    text = text.strip()
    value: object
    if key == "unix_socket_mode":
        value = parse_mode(text)
    elif field_type == "int":
        value = parse_int(text)
    elif field_type == "float":
        value = parse_duration(text)
    elif field_type == "bool":
        value = parse_bool(text)
    elif field_type == "tuple[str, ...]":
        value = parse_list(text)
    elif key.endswith("_sslmode"):
        value = text.lower()
    else:
        value = text
    check_value(key, value)
    if key in NOT_YET_IMPLEMENTED and value != getattr(_DEFAULTS, key):
        raise NotSupported(f"{NOT_YET_IMPLEMENTED[key]}; remove it or set it to its default, "
                           f"{getattr(_DEFAULTS, key)}")
    return value


def _problem(at: str, key: str, exc: ValueError) -> SettingsError:
    if isinstance(exc, NotSupported):
        return SettingsError(f"{at}: key {key} is not supported yet: {exc}")
    return SettingsError(f"{at}: {key}: {exc}")


@dataclass(frozen=True)
class _Section:
    """Where one section's keys are, for messages: `path:line [name]`."""

    path: str
    name: str
    lines: dict[str, int] = field(default_factory=dict)  # key as written -> its line

    def at(self, key: str) -> str:
        line = self.lines.get(key)
        return f"{self.path}:{line} [{self.name}]" if line else f"{self.path} [{self.name}]"


def _key_lines(text: str) -> dict[str, dict[str, int]]:
    """section -> key (as written) -> the line that sets it (the last one, as configparser)."""
    lines: dict[str, dict[str, int]] = {}
    section: dict[str, int] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"\[([^\]]+)\]", line)
        if header:
            section = lines.setdefault(header.group(1), {})
        elif section is not None and line[:1] not in ("", " ", "\t", ";", "#") and "=" in line:
            section[line.split("=", 1)[0].strip()] = number
    return lines


# --- sections ---------------------------------------------------------------------------------


def _database_entry(name: str, text: str, where: str) -> DatabaseEntry:
    try:
        raw = parse_connstring(text)
    except ValueError as exc:
        raise SettingsError(f"{where}: database {name!r}: {exc}") from None
    known = {f.name for f in dataclasses.fields(DatabaseEntry)}
    values: dict[str, object] = {"name": name}
    for key, value in raw.items():
        if key == "reserve_pool":  # PgBouncer's old name, still read
            key = "reserve_pool_size"
        if key not in known or key == "name":
            log.warning("%s: database %r: unknown key %r ignored", where, name, key)
            continue
        try:
            if key == "port" or key in _INT_DB_KEYS:
                values[key] = parse_int(value)
            elif key in ("server_lifetime", "query_wait_timeout"):
                values[key] = parse_duration(value)
            elif key == "load_balance_hosts" and value not in LOAD_BALANCE_HOSTS:
                raise ValueError(f"must be one of {', '.join(LOAD_BALANCE_HOSTS)}, not {value!r}")
            else:
                values[key] = value
            check_value(key, values[key])
        except ValueError as exc:
            raise SettingsError(f"{where}: database {name!r}: {key}: {exc}") from None
    if "host" in values and str(values["host"]).startswith("/"):
        # A unix socket directory; pypool connects over TCP only, to localhost.
        log.warning("%s: database %r: unix socket host %r; using 127.0.0.1", where, name,
                    values["host"])
        values["host"] = "127.0.0.1"
    return DatabaseEntry(**values)  # type: ignore[arg-type]


def _user_entry(name: str, text: str, where: str) -> UserEntry:
    try:
        raw = parse_connstring(text)
    except ValueError as exc:
        raise SettingsError(f"{where}: user {name!r}: {exc}") from None
    values: dict[str, object] = {"name": name}
    for key, value in raw.items():
        try:
            kind = _USER_KEYS.get(key)
            if kind == "str":
                values[key] = value
            elif kind == "int":
                values[key] = parse_int(value)
            elif kind == "duration":
                values[key] = parse_duration(value)
            else:
                log.warning("%s: user %r: unknown key %r ignored", where, name, key)
                continue
            check_value(key, values[key])
        except ValueError as exc:
            raise SettingsError(f"{where}: user {name!r}: {key}: {exc}") from None
    return UserEntry(**values)  # type: ignore[arg-type]


def _peer_entry(name: str, text: str, where: str) -> PeerEntry:
    """`<peer_id> = host=... port=... pool_size=...`, checked as PgBouncer checks it."""
    try:
        peer_id = parse_int(name)
        if not 1 <= peer_id <= 0xFFFF:
            raise ValueError(f"must be between 1 and 65535, not {peer_id}")
    except ValueError as exc:
        raise SettingsError(f"{where}: peer id {name!r}: {exc}") from None
    try:
        raw = parse_connstring(text)
    except ValueError as exc:
        raise SettingsError(f"{where}: peer {peer_id}: {exc}") from None
    values: dict[str, object] = {"peer_id": peer_id}
    for key, value in raw.items():
        try:
            if key == "host":
                values[key] = value
            elif key in ("port", "pool_size"):
                values[key] = parse_int(value)
                if key == "port":
                    check_value(key, values[key])
            else:
                raise ValueError("unrecognized connection parameter (host, port, pool_size)")
        except ValueError as exc:
            raise SettingsError(f"{where}: peer {peer_id}: {key}: {exc}") from None
    if not values.get("host"):
        raise SettingsError(f"{where}: peer {peer_id}: host was not provided")
    return PeerEntry(**values)  # type: ignore[arg-type]


def pooler_settings(items: dict[str, str], where: str | _Section) -> PoolerSettings:
    """Build PoolerSettings from raw key/value strings (the [pgbouncer] section), checking
    each; `where` names the file and section (and holds the keys' lines)."""
    section = where if isinstance(where, _Section) else _Section(where, "pgbouncer")
    values: dict[str, object] = {}
    for written, raw in items.items():
        key = written.strip().lower()
        at = section.at(written)
        try:
            if key in _FIELDS:
                values[key] = parse_value(key, raw)
            elif key not in ACCEPTED_UNUSED_KEYS:
                log.warning("%s: unknown key %r ignored", at, key)
        except ValueError as exc:
            raise _problem(at, key, exc) from None
        if key in NO_EFFECT and key in values and values[key] != getattr(_DEFAULTS, key):
            log.warning("%s: %s = %s has no effect in pypool: %s", at, key, raw.strip(),
                        NO_EFFECT[key])
    return PoolerSettings(**values)  # type: ignore[arg-type]


def replace_setting(settings: PoolerSettings, key: str, text: str) -> PoolerSettings:
    """`settings` with one key set from its ini text, checked by the same `parse_value` as
    the ini (the console's SET). Raises SettingsError for an unknown, restart-only, malformed
    or out-of-range value, and `settings` stays as it was."""
    key = key.strip().lower()
    try:
        if key not in _FIELDS:
            raise SettingsError(f"unknown parameter: {key}")
        if key in RESTART_ONLY_KEYS:
            raise SettingsError(f"{key} cannot be changed at runtime")
        value = parse_value(key, text)
    except ValueError as exc:
        raise _problem("SET", key, exc) from None
    return dataclasses.replace(settings, **{key: value})  # type: ignore[arg-type]


def _ini_parser() -> configparser.ConfigParser:
    """How a PgBouncer ini is read: no interpolation, `;` and `#` comments, keys as written."""
    parser = configparser.ConfigParser(
        interpolation=None, strict=False, comment_prefixes=(";", "#"), delimiters=("=",)
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    return parser


def logfile_named_in(path: str | Path) -> str:
    """The `logfile` an ini names, read leniently: for a start that load_ini refused, whose
    reason still belongs in that log. "" when there is none or the file cannot be read."""
    parser = _ini_parser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return ""
    name = next((s for s in ("pgbouncer", "pypool") if parser.has_section(s)), None)
    return parser.get(name, "logfile", fallback="").strip() if name else ""


def load_ini(path: str | Path) -> Settings:
    """Parse a PgBouncer-format ini file."""
    path = Path(path)
    parser = _ini_parser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as bad:  # own name: mypyc types a name by its first except
        raise SettingsError(f"{path}: not UTF-8 (byte {bad.start}): {bad.reason}") from None
    try:
        parser.read_string(text, source=str(path))
    except configparser.Error as exc:
        raise SettingsError(f"{path}: {exc}") from None
    lines = _key_lines(text)

    def section(name: str) -> _Section:
        return _Section(str(path), name, lines.get(name, {}))

    name = next((s for s in ("pgbouncer", "pypool") if parser.has_section(s)), None)
    if name is None:
        raise SettingsError(f"{path}: no [pgbouncer] or [pypool] section")
    pooler = pooler_settings(dict(parser.items(name)), section(name))
    if pooler.auth_dbname in ("pgbouncer", "pypool"):
        raise SettingsError(f'{section(name).at("auth_dbname")}: cannot use the reserved '
                            f'"{pooler.auth_dbname}" database as an auth_dbname')
    for key in ("auth_file", "auth_hba_file", "auth_ident_file"):
        value = getattr(pooler, key)
        if value and not Path(value).is_absolute():  # beside the ini, wherever pypool runs
            pooler = dataclasses.replace(pooler, **{key: str(path.parent / value)})  # type: ignore[arg-type]
    databases: dict[str, DatabaseEntry] = {}
    if parser.has_section("databases"):
        where = section("databases")
        for db, value in parser.items("databases"):
            databases[db] = _database_entry(db, value, where.at(db))
    users: dict[str, UserEntry] = {}
    if parser.has_section("users"):
        where = section("users")
        for user, value in parser.items("users"):
            users[user] = _user_entry(user, value, where.at(user))
    peers: dict[int, PeerEntry] = {}
    if parser.has_section("peers"):
        where = section("peers")
        for name, value in parser.items("peers"):
            peer = _peer_entry(name, value, where.at(name))
            peers[peer.peer_id] = peer
    return Settings(pooler=pooler, databases=databases, users=users, peers=peers,
                    path=str(path))


def from_url(url: str, listen_port: int = 6432) -> Settings:
    """The quick start: pool one database named by a postgresql:// URL (libpq_url.py says
    which URL parameters it takes; any other is refused by name).

    Clients log in with the same user and password as the URL (SCRAM), and the pooler logs
    into the server with them.
    """
    try:
        parts = parse_libpq_url(url)
    except ValueError as exc:
        raise SettingsError(f"DATABASE_URL: {exc}") from None
    user = parts.user or "postgres"
    password = parts.password
    dbname = parts.dbname or user
    balance = parts.database_keys.get("load_balance_hosts", "disable")
    if balance not in ("disable", "random"):
        raise SettingsError(f"DATABASE_URL: load_balance_hosts must be disable or random, not "
                            f"{balance!r}")
    entry = DatabaseEntry(
        name=dbname, host=",".join(parts.hosts) or "127.0.0.1", port=parts.port,
        dbname=dbname, application_name=parts.database_keys.get("application_name", ""),
        # libpq's random spreads connections over the hosts, as round-robin does here
        load_balance_hosts="disable" if balance == "disable" else "round-robin",
    )
    pooler = PoolerSettings(
        listen_port=listen_port,
        pool_mode="transaction",
        auth_type="scram-sha-256" if password else "trust",
        admin_users=(user,),
        max_client_conn=10000,
    )
    for key, text in parts.pooler_keys.items():
        try:
            pooler = dataclasses.replace(pooler, **{key: parse_value(key, text)})  # type: ignore[arg-type]
        except ValueError as exc:
            raise SettingsError(f"DATABASE_URL: {key}: {exc}") from None
    # Without a password the pooler trusts the URL's user, and only it: trust needs a user
    # the pooler knows.
    return Settings(pooler=pooler, databases={dbname: entry}, inline_users={user: password})


def worker_share(settings: Settings, workers: int) -> Settings:
    """One worker's share when `workers` processes split the load (SO_REUSEPORT).

    Each worker keeps its own pools, so the server-side sizes and the client cap are divided
    between them (rounded up, at least 1 where the original was non-zero).
    """
    if workers <= 1:
        return settings

    def part(value: int | None) -> int | None:
        if not value:
            return value
        return max(1, -(-value // workers))

    cfg = settings.pooler
    pooler = dataclasses.replace(
        cfg,
        default_pool_size=part(cfg.default_pool_size) or 0,
        min_pool_size=part(cfg.min_pool_size) or 0,
        reserve_pool_size=part(cfg.reserve_pool_size) or 0,
        max_db_connections=part(cfg.max_db_connections) or 0,
        max_user_connections=part(cfg.max_user_connections) or 0,
        max_client_conn=part(cfg.max_client_conn) or 0,
    )
    databases = {
        name: dataclasses.replace(
            entry,
            pool_size=part(entry.pool_size),
            min_pool_size=part(entry.min_pool_size),
            reserve_pool_size=part(entry.reserve_pool_size),
            max_db_connections=part(entry.max_db_connections),
        )
        for name, entry in settings.databases.items()
    }
    users = {
        name: dataclasses.replace(
            user, pool_size=part(user.pool_size),
            max_user_connections=part(user.max_user_connections),
        )
        for name, user in settings.users.items()
    }
    return dataclasses.replace(settings, pooler=pooler, databases=databases, users=users)
