"""Configuration: a PgBouncer-format ini (or a DATABASE_URL) parsed once into frozen dataclasses.

Every supported key and its default lives in `PoolerSettings` below, in one place; units
follow PgBouncer (times in seconds, fractions allowed, or with a unit suffix such as `500ms`).
Errors name the file and the key. An unknown key is a warning, never a crash: an operator's
pgbouncer.ini carries keys pypool does not implement (TLS, DNS, ...), and those keep working
in PgBouncer's place as no-ops.
"""

from __future__ import annotations

import configparser
import dataclasses
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

log = logging.getLogger("pypool.settings")

POOL_MODES = ("session", "transaction", "statement")
AUTH_TYPES = ("scram-sha-256", "md5", "plain", "trust", "any", "hba", "cert")

# The keys PgBouncer accepts that pypool parses but does not act on.
ACCEPTED_UNUSED_KEYS = frozenset(
    """
    user unix_socket_dir unix_socket_mode unix_socket_group auth_hba_file auth_ident_file
    auth_dbname syslog syslog_ident syslog_facility listen_backlog sbuf_loopcnt
    suspend_timeout tcp_defer_accept tcp_socket_buffer tcp_keepalive tcp_keepcnt
    tcp_keepidle tcp_keepintvl tcp_user_timeout dns_max_ttl dns_nxdomain_ttl dns_zone_check_period
    resolv_conf disable_pqexec server_round_robin server_fast_close peer_id
    client_tls_sslmode client_tls_key_file client_tls_cert_file client_tls_ca_file
    client_tls_protocols client_tls_ciphers client_tls_ecdhcurve client_tls_dheparams
    client_tls13_ciphers server_tls_sslmode server_tls_ca_file server_tls_key_file
    server_tls_cert_file server_tls_protocols server_tls_ciphers server_tls13_ciphers
    verbose max_packet_size_warn cancel_wait_timeout
    """.split()
)


class SettingsError(Exception):
    """The configuration cannot be used; the message names the file and key."""


def parse_duration(text: str) -> float:
    """Seconds from PgBouncer's time syntax: `15`, `0.5`, `500ms`, `2min`, `1h`."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(us|ms|s|min|h|d)?\s*", text)
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


@dataclass(frozen=True)
class PoolerSettings:
    """The [pgbouncer] (or [pypool]) section. Field names are the ini keys."""

    listen_addr: str = "127.0.0.1"
    listen_port: int = 6432
    pool_mode: str = "session"
    default_pool_size: int = 20
    min_pool_size: int = 0
    reserve_pool_size: int = 0
    reserve_pool_timeout: float = 5.0
    max_client_conn: int = 100
    max_db_connections: int = 0
    max_user_connections: int = 0
    max_prepared_statements: int = 200
    max_client_prepared_statements: int = 10000
    pipeline_depth: int = 0
    query_wait_timeout: float = 120.0
    query_wait_notify: float = 5.0
    query_timeout: float = 0.0
    idle_transaction_timeout: float = 0.0
    transaction_timeout: float = 0.0
    client_idle_timeout: float = 0.0
    client_login_timeout: float = 60.0
    server_lifetime: float = 3600.0
    server_idle_timeout: float = 600.0
    server_connect_timeout: float = 15.0
    server_login_retry: float = 15.0
    server_reset_query: str = "DISCARD ALL"
    server_reset_query_always: bool = False
    server_check_query: str = "select 1"
    server_check_delay: float = 30.0
    auth_type: str = "md5"
    auth_file: str = ""
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


# Keys that only take effect at start (PgBouncer's CF_NO_RELOAD, plus pypool's listeners):
# a reload keeps their old values and says so, and SET refuses them.
RESTART_ONLY_KEYS = frozenset(
    {"listen_addr", "listen_port", "pidfile", "logfile", "pkt_buf", "so_reuseport", "workers",
     "track_extra_parameters", "metrics_addr", "metrics_port"}
)


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
    auth_user: str = ""
    application_name: str = ""
    client_encoding: str = ""
    datestyle: str = ""
    timezone: str = ""
    connect_query: str = ""

    @property
    def server_dbname(self) -> str:
        return self.dbname or self.name


@dataclass(frozen=True)
class UserEntry:
    """One line of [users]: per-user overrides."""

    name: str
    pool_mode: str | None = None
    pool_size: int | None = None
    max_user_connections: int | None = None
    transaction_timeout: float | None = None


@dataclass(frozen=True)
class Settings:
    pooler: PoolerSettings = field(default_factory=PoolerSettings)
    databases: dict[str, DatabaseEntry] = field(default_factory=dict)
    users: dict[str, UserEntry] = field(default_factory=dict)
    path: str = ""
    # Users known without an auth_file (the quick start's URL): name -> plaintext secret.
    inline_users: dict[str, str] = field(default_factory=dict)

    def database(self, name: str) -> DatabaseEntry | None:
        """The [databases] entry for `name`, falling back to the `*` entry."""
        entry = self.databases.get(name)
        if entry is None and "*" in self.databases:
            entry = dataclasses.replace(self.databases["*"], name=name)
        return entry


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


_INT_DB_KEYS = ("pool_size", "min_pool_size", "reserve_pool_size", "max_db_connections")


def _database_entry(name: str, text: str, where: str) -> DatabaseEntry:
    try:
        raw = parse_connstring(text)
    except ValueError as exc:
        raise SettingsError(f"{where}: database {name!r}: {exc}") from None
    known = {f.name for f in dataclasses.fields(DatabaseEntry)}
    values: dict[str, object] = {"name": name}
    for key, value in raw.items():
        if key not in known or key == "name":
            log.warning("%s: database %r: unknown key %r ignored", where, name, key)
            continue
        try:
            if key == "port" or key in _INT_DB_KEYS:
                values[key] = int(value)
            elif key == "pool_mode":
                if value not in POOL_MODES:
                    raise ValueError(f"pool_mode must be one of {POOL_MODES}")
                values[key] = value
            else:
                values[key] = value
        except ValueError as exc:
            raise SettingsError(f"{where}: database {name!r}: {key}: {exc}") from None
    if "host" in values and str(values["host"]).startswith("/"):
        # A unix socket directory; pypool connects over TCP only, to localhost.
        log.warning("%s: database %r: unix socket host %r; using 127.0.0.1", where, name,
                    values["host"])
        values["host"] = "127.0.0.1"
    return DatabaseEntry(**values)  # type: ignore[arg-type]


def _user_entry(name: str, text: str, where: str) -> UserEntry:
    raw = parse_connstring(text)
    values: dict[str, object] = {"name": name}
    for key, value in raw.items():
        if key == "pool_mode":
            values[key] = value
        elif key in ("pool_size", "max_user_connections"):
            values[key] = int(value)
        elif key == "transaction_timeout":
            values[key] = parse_duration(value)
        else:
            log.warning("%s: user %r: unknown key %r ignored", where, name, key)
    return UserEntry(**values)  # type: ignore[arg-type]


def _convert(field_type: str, key: str, value: str) -> object:
    value = value.strip()
    if field_type == "int":
        return int(value)
    if field_type == "float":
        return parse_duration(value)
    if field_type == "bool":
        return parse_bool(value)
    if field_type == "tuple[str, ...]":
        return parse_list(value)
    return value


def pooler_settings(items: dict[str, str], where: str) -> PoolerSettings:
    """Build PoolerSettings from raw key/value strings, validating each."""
    fields = {f.name: f for f in dataclasses.fields(PoolerSettings)}
    values: dict[str, object] = {}
    for key, raw in items.items():
        key = key.strip().lower()
        if key not in fields:
            if key not in ACCEPTED_UNUSED_KEYS:
                log.warning("%s: unknown key %r ignored", where, key)
            continue
        try:
            values[key] = _convert(str(fields[key].type), key, raw)
        except ValueError as exc:
            raise SettingsError(f"{where}: {key}: {exc}") from None
    return _validated(PoolerSettings(**values), where)  # type: ignore[arg-type]


def replace_setting(settings: PoolerSettings, key: str, text: str) -> PoolerSettings:
    """`settings` with one key set from its ini text, validated as the ini would be (the
    console's SET). Raises SettingsError for an unknown, restart-only or malformed key."""
    fields = {f.name: f for f in dataclasses.fields(PoolerSettings)}
    key = key.strip().lower()
    if key not in fields:
        raise SettingsError(f"unknown parameter: {key}")
    if key in RESTART_ONLY_KEYS:
        raise SettingsError(f"{key} cannot be changed at runtime")
    try:
        value = _convert(str(fields[key].type), key, text)
    except ValueError as exc:
        raise SettingsError(f"{key}: {exc}") from None
    changed = dataclasses.replace(settings, **{key: value})  # type: ignore[arg-type]
    return _validated(changed, "SET")


def _validated(settings: PoolerSettings, where: str) -> PoolerSettings:
    if settings.pool_mode not in POOL_MODES:
        raise SettingsError(f"{where}: pool_mode: must be one of {', '.join(POOL_MODES)}")
    if settings.auth_type not in AUTH_TYPES:
        raise SettingsError(f"{where}: auth_type: unsupported value {settings.auth_type!r}")
    if settings.auth_type in ("hba", "cert"):
        raise SettingsError(f"{where}: auth_type: {settings.auth_type} is not supported")
    return settings


def load_ini(path: str | Path) -> Settings:
    """Parse a PgBouncer-format ini file."""
    path = Path(path)
    parser = configparser.ConfigParser(
        interpolation=None, strict=False, comment_prefixes=(";", "#"), delimiters=("=",)
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        parser.read_string(text, source=str(path))
    except configparser.Error as exc:
        raise SettingsError(f"{path}: {exc}") from None
    section = next((s for s in ("pgbouncer", "pypool") if parser.has_section(s)), None)
    if section is None:
        raise SettingsError(f"{path}: no [pgbouncer] or [pypool] section")
    pooler = pooler_settings(dict(parser.items(section)), f"{path} [{section}]")
    if pooler.auth_file and not Path(pooler.auth_file).is_absolute():
        pooler = dataclasses.replace(pooler, auth_file=str(path.parent / pooler.auth_file))
    databases: dict[str, DatabaseEntry] = {}
    if parser.has_section("databases"):
        for name, value in parser.items("databases"):
            databases[name] = _database_entry(name, value, f"{path} [databases]")
    users: dict[str, UserEntry] = {}
    if parser.has_section("users"):
        for name, value in parser.items("users"):
            users[name] = _user_entry(name, value, f"{path} [users]")
    return Settings(pooler=pooler, databases=databases, users=users, path=str(path))


def from_url(url: str, listen_port: int = 6432) -> Settings:
    """The quick start: pool one database named by a postgresql:// URL.

    Clients log in with the same user and password as the URL (SCRAM), and the pooler logs
    into the server with them.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise SettingsError(f"{url!r}: not a postgresql:// URL")
    user = unquote(parts.username or "postgres")
    password = unquote(parts.password or "")
    dbname = unquote(parts.path.lstrip("/")) or user
    entry = DatabaseEntry(
        name=dbname, host=parts.hostname or "127.0.0.1", port=parts.port or 5432, dbname=dbname
    )
    pooler = PoolerSettings(
        listen_port=listen_port,
        pool_mode="transaction",
        auth_type="scram-sha-256" if password else "trust",
        admin_users=(user,),
        max_client_conn=10000,
    )
    return Settings(
        pooler=pooler, databases={dbname: entry}, inline_users={user: password} if password else {}
    )


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
