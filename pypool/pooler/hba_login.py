"""`auth_type = hba` at login: which method the hba file picks for a client, as PgBouncer's.

`load` reads auth_hba_file and auth_ident_file (on start and on every reload) into the rules
that auth/hba.py parses; `method_for` matches a logging-in client against them and returns
the auth_type to use for it (trust, md5, scram-sha-256, plain, peer), or raises the
PoolerError that PgBouncer's refusal carries (FATAL 08P01, its texts): no rule, `reject`.
A `peer` rule with `map=` is settled here, against the ident map.

Where the client's connection is TLS (`client.tls_info` set by net/tls.py), hostssl rules
apply to it and hostnossl ones do not. A `cert` rule is the certificate login of
auth_type = cert (net/client.py), or with `map=`, the ident map over the certificate's
common names.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..auth.hba import HbaRules, IdentMaps, Login, parse_hba, parse_ident
from ..net import tls
from ..net.unix_socket import os_user_name
from ..protocol import errors, replication
from ..protocol.errors import PoolerError

if TYPE_CHECKING:
    from ..net.records import ClientRecord
    from ..settings import PoolerSettings

log = logging.getLogger("pypool")


@dataclass(frozen=True)
class HbaConfig:
    """The rules in force. `rules` None: the hba file could not be read, so every login
    under auth_type = hba is refused (as PgBouncer, which keeps no old copy either)."""

    rules: HbaRules | None = None
    maps: IdentMaps = field(default_factory=IdentMaps)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def load(cfg: PoolerSettings) -> HbaConfig:
    """Read and parse the ident and hba files; log each problem line as a warning."""
    if cfg.auth_type != "hba":
        return HbaConfig()
    maps = IdentMaps()
    if cfg.auth_ident_file:
        try:
            maps, problems = parse_ident(_read(cfg.auth_ident_file), cfg.auth_ident_file)
        except (OSError, UnicodeDecodeError) as exc:
            log.error("could not open ident config file %s: %s", cfg.auth_ident_file, exc)
        else:
            for problem in problems:
                log.warning("auth_ident_file %s", problem)
    if not cfg.auth_hba_file:
        log.error("auth_type = hba but auth_hba_file is not set: every login is refused")
        return HbaConfig(None, maps)
    try:
        text = _read(cfg.auth_hba_file)
    except (OSError, UnicodeDecodeError) as exc:
        log.error("could not open hba config file %s: %s", cfg.auth_hba_file, exc)
        return HbaConfig(None, maps)
    rules, problems = parse_hba(text, cfg.auth_hba_file, maps, _read)
    for problem in problems:
        log.warning("auth_hba_file %s", problem)
    return HbaConfig(rules, maps)


def method_for(hba: HbaConfig, client: ClientRecord) -> str:
    """The auth_type the hba rules pick for `client`, or a PoolerError refusing it."""
    unix = client.peer[0] == "unix"
    login = Login(
        address=None if unix else client.peer[0],
        tls=bool(client.tls_info),
        database=client.database,
        user=client.user,
        replication=replication.kind_or_none(client.startup_params) == replication.PHYSICAL,
    )
    rule = hba.rules.match(login) if hba.rules is not None else None
    if rule is None:
        raise PoolerError("no authentication method is found", side=errors.Side.CLIENT)
    log.debug("%r: HBA line %d is matched", client, rule.line)
    if rule.method == "reject":
        raise PoolerError("login rejected", side=errors.Side.CLIENT)
    if rule.method == "cert" and rule.map:
        names = tls.peer_common_names(client.transport) if client.tls_info else None
        if not names or not any(hba.maps.allows(rule.map, name, client.user) for name in names):
            log.warning("%r: ident map: %s does not have a match", client, rule.map)
            raise PoolerError("certificate authentication failed", side=errors.Side.CLIENT)
        return "trust"  # the certificate, through the map, vouches for the user
    if rule.method == "peer" and rule.map:
        os_user = os_user_name(client.peer_uid) if unix else None
        if os_user is None or not hba.maps.allows(rule.map, os_user, client.user):
            log.warning("%r: ident map %s cannot be matched", client, rule.map)
            raise PoolerError("unix socket login rejected", errors.INVALID_AUTHORIZATION,
                              side=errors.Side.CLIENT)
        log.debug("%r: ident map '%s' is applied", client, rule.map)
        return "trust"  # the map has vouched for the OS user, which is what peer checks
    return rule.method
