"""The console's commands: PAUSE, RESUME, KILL, RECONNECT, DISABLE, SET, ... as PgBouncer 1.24.

Each command is a function of the pooler and its argument that changes the pooler's state
through the pooler's own methods (pause, close, reload: control.py's PoolerControl) and
returns what the console should answer: `Done` at once, `WaitFor` a condition (PAUSE and
WAIT_CLOSE answer only once the servers are gone), or `NO_REPLY` (SHUTDOWN leaves without a
word, like PgBouncer).
A refusal raises `AdminError` with PgBouncer's message; the console sends it as a non-fatal
ERROR 08P01 and the session carries on. Who may run a command is the console's business.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..observe.view import ADMIN_DB, database_entry
from ..protocol import errors
from ..protocol.errors import PoolerError
from ..settings import SettingsError, replace_setting
from .control import PoolerControl
from .show import FAKE_PARAMS, config_text

if TYPE_CHECKING:
    from ..pooling.pool import Pool

log = logging.getLogger("pypool.admin")

ADMIN_DATABASES = (ADMIN_DB, "pypool")


class AdminError(Exception):
    """A command refused; `message` is PgBouncer's text for the same refusal."""

    def __init__(self, message: str, sqlstate: str = errors.PROTOCOL_VIOLATION) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate


class InvalidCommand(Exception):
    """Not a command the console knows: answered "invalid command '<query>', use SHOW HELP;"."""


@dataclass(frozen=True)
class Done:
    """Answer now with CommandComplete `tag`, after `notice` if any; then run `then`."""

    tag: str
    notice: str = ""
    then: Callable[[], None] | None = None


@dataclass(frozen=True)
class WaitFor:
    """Answer with CommandComplete `tag` once `until()` holds."""

    until: Callable[[], bool]
    tag: str


NO_REPLY = Done("")
Reply = Done | WaitFor


def _pools_of(pooler: PoolerControl, database: str | None) -> list[Pool]:
    return [p for p in pooler.pools.values() if database is None or p.database == database]


def _database(pooler: PoolerControl, name: str, verb: str) -> str:
    """`name` if it is a database the pooler serves; PgBouncer's refusals otherwise."""
    if name in ADMIN_DATABASES:
        raise AdminError(f"cannot {verb} admin db: {name}")
    if database_entry(pooler, name) is None:
        raise AdminError(f"no such database: {name}")
    return name


def _no_servers(pooler: PoolerControl, database: str | None) -> Callable[[], bool]:
    return lambda: all(pool.server_count == 0 for pool in _pools_of(pooler, database))


def pause(pooler: PoolerControl, arg: str) -> Reply:
    """Stop handing out servers, close each server as its transaction ends; answer once the
    servers (of `arg`, or of all databases) are gone. New queries wait until RESUME."""
    if pooler.paused_all:
        raise AdminError("already suspended/paused")
    if not arg:
        log.info("PAUSE command issued")
        pooler.pause_all(True)
        return WaitFor(_no_servers(pooler, None), "PAUSE")
    log.info("PAUSE '%s' command issued", arg)
    database = _database(pooler, arg, "pause")
    pooler.paused_dbs.add(database)
    for pool in _pools_of(pooler, database):
        pooler.set_paused(pool, True)
    return WaitFor(_no_servers(pooler, database), "PAUSE")


def suspend(pooler: PoolerControl, arg: str) -> Reply:
    """SUSPEND: let what is in flight finish, then hold every client until RESUME.

    PgBouncer flushes every socket and stops reading them, so that an online restart (-R)
    can take them over with their servers. pypool has no online restart to hand them to: it
    suspends as PAUSE pauses (each server closes once released, new ones open at RESUME),
    answers once no transaction is running, and SHOW STATE says suspended."""
    if pooler.paused_all:
        raise AdminError("already suspended/paused")
    if pooler.paused_dbs:
        raise AdminError("cannot suspend with paused databases")
    log.info("SUSPEND command issued")
    pooler.suspended = True
    pooler.pause_all(True)
    return WaitFor(lambda: all(not pool.active for pool in _pools_of(pooler, None)), "SUSPEND")


def resume(pooler: PoolerControl, arg: str) -> Reply:
    if not arg:
        log.info("RESUME command issued")
        if pooler.shutting_down:
            raise AdminError("pooler is shutting down")
        if not pooler.paused_all:
            raise AdminError("pooler is not paused/suspended")
        pooler.suspended = False
        pooler.pause_all(False)
        return Done("RESUME")
    log.info("RESUME '%s' command issued", arg)
    if database_entry(pooler, arg) is None:
        raise AdminError(f"no such database: {arg}")
    if arg not in pooler.paused_dbs:
        raise AdminError(f"database {arg} is not paused")
    pooler.paused_dbs.discard(arg)
    for pool in _pools_of(pooler, arg):
        pooler.set_paused(pool, pooler.paused_all)
    return Done("RESUME")


def kill(pooler: PoolerControl, arg: str) -> Reply:
    """Drop every client and server of a database now; it stays paused until RESUME db.
    Without a database (PgBouncer 1.25): every database that has a pool, each paused."""
    if pooler.paused_all:
        raise AdminError("already suspended/paused")
    if arg:
        log.info("KILL '%s' command issued", arg)
        database: str | None = _database(pooler, arg, "kill")
    else:
        log.info("KILL command issued")
        database = None
    for pool in _pools_of(pooler, database):
        pooler.paused_dbs.add(pool.database)
        pooler.set_paused(pool, True)
        for client in list(pool.clients):
            client.fail(PoolerError("database removed"))
        # Servers still logging in close as soon as they are in (the pool is paused).
        for server in list(pool.active) + list(pool.idle):
            pooler.close_server(server, "database removed")
    if database is not None:
        pooler.paused_dbs.add(database)  # also with no pool yet
    return Done("KILL")


def kill_client(pooler: PoolerControl, arg: str) -> Reply:
    """Disconnect one client, by the `id` column of SHOW CLIENTS."""
    try:
        target = int(arg)
    except ValueError:
        raise AdminError("invalid client pointer supplied") from None
    for client in pooler.clients:
        if client.id == target and client not in pooler.login_clients:
            client.fail(PoolerError("admin forced disconnect"))
            return Done("KILL_CLIENT")
    raise AdminError("client not found")


def reconnect(pooler: PoolerControl, arg: str) -> Reply:
    """Close every server (of `arg`, or all) as soon as it is released; new ones replace them."""
    if arg:
        log.info("RECONNECT '%s' command issued", arg)
        database: str | None = _database(pooler, arg, "reconnect")
    else:
        log.info("RECONNECT command issued")
        database = None
    for pool in _pools_of(pooler, database):
        pooler.tag_dirty(pool, "RECONNECT")
    return Done("RECONNECT")


def wait_close(pooler: PoolerControl, arg: str) -> Reply:
    """Answer once no server tagged by RECONNECT (or a changed [databases] entry) is left."""
    if arg:
        log.info("WAIT_CLOSE '%s' command issued", arg)
        database: str | None = _database(pooler, arg, "wait in")
    else:
        log.info("WAIT_CLOSE command issued")
        database = None
    return WaitFor(lambda: not any(pool.close_pending() for pool in _pools_of(pooler, database)),
                   "WAIT_CLOSE")


def disable(pooler: PoolerControl, arg: str) -> Reply:
    """Refuse new clients of a database; the connected ones carry on."""
    if not arg:
        raise AdminError("a database is required")
    log.info("DISABLE '%s' command issued", arg)
    database = _database(pooler, arg, "disable")
    pooler.disabled_dbs.add(database)
    for pool in _pools_of(pooler, database):
        pool.disabled = True
    return Done("DISABLE")


def enable(pooler: PoolerControl, arg: str) -> Reply:
    if not arg:
        raise AdminError("a database is required")
    log.info("ENABLE '%s' command issued", arg)
    database = _database(pooler, arg, "enable")
    pooler.disabled_dbs.discard(database)
    for pool in _pools_of(pooler, database):
        pool.disabled = False
    return Done("ENABLE")


def reload(pooler: PoolerControl, arg: str) -> Reply:
    log.info("RELOAD command issued")
    if pooler.reload():
        return Done("RELOAD")
    # PgBouncer 1.25's answer: an ERROR with SQLSTATE F0000 (config_file_error); up to 1.24
    # RELOAD answered RELOAD whatever happened. The old configuration stays in force; the
    # log says why.
    log.error("RELOAD failed, see logs for more details")
    raise AdminError(RELOAD_FAILED, CONFIG_FILE_ERROR)


def shutdown(pooler: PoolerControl, arg: str) -> Reply:
    """SHUTDOWN: exit now. WAIT_FOR_SERVERS: as SIGINT (let transactions finish).
    WAIT_FOR_CLIENTS: as SIGTERM (let clients leave). DRAIN (pypool's): end each client at
    its next transaction boundary, then exit."""
    mode = arg.upper()
    if mode == "":
        log.info("SHUTDOWN command issued")
        pooler.shutdown("now")
        return NO_REPLY
    how = {"WAIT_FOR_SERVERS": "SIGINT", "WAIT_FOR_CLIENTS": "SIGTERM",
           "DRAIN": "DRAIN"}.get(mode)
    if how is None:
        raise InvalidCommand(arg)
    log.info("SHUTDOWN %s command issued", mode)
    return Done("SHUTDOWN", then=lambda: pooler.shutdown(how))


RELOAD_FAILED = "RELOAD failed, see logs for additional details"
CONFIG_FILE_ERROR = "F0000"
# PgBouncer's NOTICE for a TLS key whose new value cannot be put to use yet.
TLS_NOT_APPLIED = "TLS settings could not be applied, still using old configuration"


def set_param(pooler: PoolerControl, key: str, value: str, is_admin: bool) -> Reply:
    """SET key = value: a [pgbouncer] key, live, as a RELOAD with that one key changed.

    The value is parsed and checked by the ini's own parser (`replace_setting`), so SET
    cannot install what the ini would refuse (`default_pool_size = -1` would leave every
    client waiting). A refusal keeps the old value and answers PgBouncer's `SET failed`; the
    reason goes to the log, as PgBouncer's does.
    """
    if key.lower() in FAKE_PARAMS:
        return Done("SET", notice="SET ignored")
    if not is_admin:
        raise AdminError("admin access needed")
    try:
        new = replace_setting(pooler.settings.pooler, key, value)
    except SettingsError as exc:
        log.warning("%s; %s", exc, _kept(pooler, key))
        raise AdminError("SET failed") from None
    log.info("SET %s = %r", key, value)
    pooler.apply_settings(dataclasses.replace(pooler.settings, pooler=new))
    if key.strip().lower().startswith(("client_tls", "server_tls")):
        # The ini's parser checks one value; TLS needs the files and the other keys too, set
        # one SET at a time in any order. As PgBouncer: the value is kept (SHOW CONFIG shows
        # it), the TLS in force stays (apply_settings tried it), and the SET says so.
        problem = pooler.tls_failure
        if problem is not None:
            log.warning("SET %s: TLS settings could not be applied (%s), still using the old "
                        "configuration", key, problem)
            return Done(f"SET {key}={value}", notice=TLS_NOT_APPLIED)
    return Done(f"SET {key}={value}")


def trace(pooler: PoolerControl, target: str, switch: str) -> Reply:
    """TRACE <client id|application_name> on|off: the protocol trace of some clients while
    running (pypool's own, docs/research.md). The answer's tag counts the clients traced."""
    if switch.lower() not in ("on", "off"):
        raise AdminError("TRACE takes on or off")
    on = switch.lower() == "on"
    count = pooler.trace_client(target, on)
    log.info("TRACE %s %s (%d clients traced)", target, "on" if on else "off", count)
    return Done(f"TRACE {count}")


def _kept(pooler: PoolerControl, key: str) -> str:
    """What a refused SET left in force, for the log: `key stays '5'`."""
    name = key.strip().lower()
    if not hasattr(pooler.settings.pooler, name):
        return "nothing changed"
    return f"{name} stays {config_text(getattr(pooler.settings.pooler, name))!r}"


# Commands that take an optional argument, by name. SHOW and SET are parsed by the console.
COMMANDS: dict[str, Callable[[PoolerControl, str], Reply]] = {
    "disable": disable,
    "enable": enable,
    "kill": kill,
    "kill_client": kill_client,
    "pause": pause,
    "reconnect": reconnect,
    "reload": reload,
    "resume": resume,
    "shutdown": shutdown,
    "suspend": suspend,
    "wait_close": wait_close,
}
# Commands that reject any argument (PgBouncer answers "invalid command" instead).
NO_ARGUMENT = frozenset({"reload", "suspend"})
