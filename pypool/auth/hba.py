"""`auth_type = hba`: the pg_hba.conf subset PgBouncer reads (auth_hba_file) and its ident
maps (auth_ident_file), parsed and matched without touching a file or a socket.

A rule is `TYPE DATABASE USER [ADDRESS [MASK]] METHOD [map=NAME]`, one a line, `#` to the end
of the line a comment. The first rule whose connection type, address, database and user
fit a login decides its method; no fitting rule refuses the login. What is read:

- types `local` (the unix socket), `host` (TCP), `hostssl` and `hostnossl` (TCP with and
  without TLS);
- database: `all`, `sameuser` (the database named as the user), `replication` (a physical
  replication connection, and only that), names, `@file` (names read from a file beside the
  hba file), comma-separated; user: `all`, names, `@file`;
- address: `all`, an IPv4 or IPv6 address with `/bits` or a separate mask;
- method: trust, reject, md5, password (cleartext), scram-sha-256, peer, cert; then
  `map=NAME`, an auth_ident_file map (for peer and cert).

As PostgreSQL, a token in double quotes is a name, never a keyword (`"all"` is a user called
all), and `""` inside quotes is one quote. What PgBouncer does not read (samerole, samegroup,
`+group`, host names, samehost, samenet, other methods or options) makes its line a problem:
the line is skipped and the rest of the file still applies, and the problem is reported
with the file and line so that the operator sees it in the log.

An ident map line is `MAPNAME SYSTEM-USER DATABASE-USER`, DATABASE-USER a name or `all`.

This module never opens a file: the caller passes the text, and a `read_names` callable for
`@file`. It never logs either: problems come back as strings.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass, field

# The method keywords, and the auth_type each one means.
METHODS = {
    "trust": "trust",
    "reject": "reject",
    "md5": "md5",
    "password": "plain",
    "scram-sha-256": "scram-sha-256",
    "peer": "peer",
    "cert": "cert",
}
CONNECTION_TYPES = ("local", "host", "hostssl", "hostnossl")


class HbaSyntaxError(ValueError):
    """One line cannot be read; the message says what is wrong with it."""


# --- tokens ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    """One field, or one comma. `quoted`: written in double quotes, so never a keyword."""

    text: str
    quoted: bool = False

    @property
    def is_comma(self) -> bool:
        return self.text == "," and not self.quoted

    def keyword(self, word: str) -> bool:
        return not self.quoted and self.text == word


def tokens(line: str) -> list[Token]:
    """The tokens of one line, up to its comment. Raises HbaSyntaxError for an unterminated
    quote."""
    found: list[Token] = []
    pos, n = 0, len(line)
    while pos < n:
        ch = line[pos]
        if ch.isspace():
            pos += 1
        elif ch == "#":
            break
        elif ch == ",":
            found.append(Token(","))
            pos += 1
        elif ch == '"':
            text: list[str] = []
            pos += 1
            while True:
                if pos >= n:
                    raise HbaSyntaxError("unterminated quoted string")
                if line[pos] == '"':
                    if pos + 1 < n and line[pos + 1] == '"':
                        text.append('"')
                        pos += 2
                        continue
                    pos += 1
                    break
                text.append(line[pos])
                pos += 1
            found.append(Token("".join(text), quoted=True))
        else:
            start = pos
            while pos < n and not line[pos].isspace() and line[pos] not in ',#"':
                pos += 1
            found.append(Token(line[start:pos]))
    return found


# --- names ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NameList:
    """A DATABASE or USER field."""

    all: bool = False
    sameuser: bool = False  # database field: the database named as the user
    replication: bool = False  # database field: physical replication connections
    names: frozenset[str] = frozenset()

    def matches(self, name: str, other: str) -> bool:
        """Whether `name` is in the list; `other` is the user for the database field."""
        return self.all or (self.sameuser and name == other) or name in self.names


ReadNames = Callable[[str], str]


class _Cursor:
    """The tokens of a line, read left to right."""

    def __init__(self, found: list[Token]) -> None:
        self.tokens = found
        self.pos = 0

    def peek(self) -> Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> Token | None:
        token = self.peek()
        self.pos += token is not None
        return token

    def rest(self) -> list[Token]:
        return self.tokens[self.pos:]


def _name_list(cursor: _Cursor, is_database: bool, base_dir: str, read_names: ReadNames,
               depth: int = 0) -> NameList:
    """One comma-separated DATABASE or USER field, from the cursor's position."""
    result = NameList()
    while True:
        token = cursor.take()
        if token is None or token.is_comma:
            raise HbaSyntaxError("a comma where a name should be" if token else
                                 "a name is missing")
        result = _union(result, _name(token, is_database, base_dir, read_names, depth))
        following = cursor.peek()
        if following is None or not following.is_comma:
            return result
        cursor.take()


def _name(token: Token, is_database: bool, base_dir: str, read_names: ReadNames,
          depth: int) -> NameList:
    if token.keyword("all"):
        return NameList(all=True)
    if is_database and token.keyword("sameuser"):
        return NameList(sameuser=True)
    if is_database and token.keyword("replication"):
        return NameList(replication=True)
    if is_database and (token.keyword("samerole") or token.keyword("samegroup")):
        raise HbaSyntaxError(f"{token.text} is not supported")
    if not token.quoted and token.text.startswith("+"):
        raise HbaSyntaxError(f"group names ({token.text}) are not supported")
    if not token.quoted and token.text.startswith("@"):
        return _names_file(token.text[1:], is_database, base_dir, read_names, depth)
    return NameList(names=frozenset({token.text}))


def _union(one: NameList, other: NameList) -> NameList:
    return NameList(all=one.all or other.all, sameuser=one.sameuser or other.sameuser,
                    replication=one.replication or other.replication,
                    names=one.names | other.names)


def _names_file(name: str, is_database: bool, base_dir: str, read_names: ReadNames,
                depth: int) -> NameList:
    """`@file`: its names, separated by commas or white space, any number a line."""
    if depth >= 10:
        raise HbaSyntaxError("@file includes nest more than 10 deep")
    path = name if os.path.isabs(name) else os.path.join(base_dir, name)
    try:
        text = read_names(path)
    except OSError as exc:
        raise HbaSyntaxError(f"cannot read @{name}: {exc.strerror or exc}") from None
    result = NameList()
    for line in text.splitlines():
        for token in tokens(line):
            if not token.is_comma:
                result = _union(result, _name(token, is_database, os.path.dirname(path),
                                              read_names, depth + 1))
    return result


# --- addresses ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Network:
    """An ADDRESS field as PgBouncer matches it: `(client & mask) == address`, the address as
    written (host bits set beyond the mask match nothing; the parser warns of that)."""

    version: int  # 4 or 6
    address: int
    mask: int

    def matches(self, client: str) -> bool:
        try:
            ip = ipaddress.ip_address(client.split("%", 1)[0])
        except ValueError:
            return False
        return ip.version == self.version and (int(ip) & self.mask) == self.address


def _network(fields: list[Token], problems: list[str]) -> tuple[Network, int]:
    """The network from the address field (and the mask field, when there is no /bits);
    returns it with the count of fields used."""
    written = fields[0].text
    text, _, bits = written.partition("/")
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise HbaSyntaxError(f"failed to parse address: {written} (host names, samehost and "
                             "samenet are not supported)") from None
    width = ip.max_prefixlen
    used = 1
    if bits:
        if not bits.isdigit() or int(bits) > width:
            raise HbaSyntaxError(f"invalid mask: /{bits}")
        mask = ((1 << width) - 1) ^ ((1 << (width - int(bits))) - 1)
    else:
        if len(fields) < 2:
            raise HbaSyntaxError("did not find mask")
        try:
            mask_ip = ipaddress.ip_address(fields[1].text)
        except ValueError:
            raise HbaSyntaxError(f"failed to parse mask: {fields[1].text}") from None
        if mask_ip.version != ip.version:
            raise HbaSyntaxError(f"failed to parse mask: {fields[1].text}")
        mask = int(mask_ip)
        used = 2
    if int(ip) & ~mask:
        problems.append(f"address does not match mask: {written}"
                        + ("" if bits else f" / {fields[1].text}"))
    return Network(ip.version, int(ip), mask), used


# --- rules ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HbaRule:
    """One line of the hba file."""

    line: int
    kind: str  # one of CONNECTION_TYPES
    databases: NameList
    users: NameList
    network: Network | None  # None: `all`, or a `local` line
    method: str  # the auth_type it means: METHODS' values
    map: str = ""  # an auth_ident_file map name, for peer and cert


@dataclass(frozen=True)
class Login:
    """What a rule is matched against."""

    address: str | None  # the client's IP address; None on the unix socket
    tls: bool
    database: str
    user: str
    replication: bool = False  # a physical replication connection


@dataclass(frozen=True)
class HbaRules:
    rules: tuple[HbaRule, ...] = ()

    def match(self, login: Login) -> HbaRule | None:
        """The first rule that fits `login`, or None (the login is refused)."""
        for rule in self.rules:
            if login.address is None:
                if rule.kind != "local":
                    continue
            elif rule.kind == "local":
                continue
            elif rule.kind == "hostssl" and not login.tls:
                continue
            elif rule.kind == "hostnossl" and login.tls:
                continue
            elif rule.network is not None and not rule.network.matches(login.address):
                continue
            if login.replication:
                if not rule.databases.replication:
                    continue
            elif not rule.databases.matches(login.database, login.user):
                continue
            if not rule.users.matches(login.user, login.database):
                continue
            return rule
        return None


def _rule(number: int, fields: list[Token], maps: IdentMaps, base_dir: str,
          read_names: ReadNames, problems: list[str]) -> HbaRule:
    kind = fields[0]
    if kind.quoted or kind.text not in CONNECTION_TYPES:
        raise HbaSyntaxError(f"unknown type {kind.text!r}")
    cursor = _Cursor(fields[1:])
    databases = _name_list(cursor, True, base_dir, read_names)
    users = _name_list(cursor, False, base_dir, read_names)
    remaining = cursor.rest()
    network: Network | None = None
    if kind.text != "local":
        if not remaining:
            raise HbaSyntaxError("did not find address")
        if remaining[0].keyword("all"):
            remaining = remaining[1:]
        else:
            network, used = _network(remaining, problems)
            remaining = remaining[used:]
    if not remaining:
        raise HbaSyntaxError("did not find the method")
    method_token = remaining[0]
    method = METHODS.get(method_token.text) if not method_token.quoted else None
    if method is None:
        raise HbaSyntaxError(f"unsupported method: {method_token.text}")
    map_name = ""
    options = remaining[1:]
    if options:
        option = options[0]
        if not option.text.startswith("map=") or option.quoted:
            raise HbaSyntaxError(f"ident map {option.text} is malformed: not in map=value format")
        map_name = option.text[4:]
        if map_name not in maps.maps:
            raise HbaSyntaxError(f"ident map {map_name} is not found in the ident file")
        if len(options) > 1:
            raise HbaSyntaxError("unsupported parameters")
    return HbaRule(number, kind.text, databases, users, network, method, map_name)


def parse_hba(text: str, path: str = "pg_hba.conf", maps: IdentMaps | None = None,
              read_names: ReadNames | None = None) -> tuple[HbaRules, list[str]]:
    """The rules of an hba file's `text`, and its problems (`path:line: what`), each for a
    line that was skipped or a mask that matches nothing. `path` names the file in the
    problems and places `@file` names; `read_names` reads those (default: none readable)."""
    maps = maps or IdentMaps()
    reader = read_names or _no_files
    base_dir = os.path.dirname(path)
    rules: list[HbaRule] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        line_problems: list[str] = []
        try:
            fields = tokens(line)
            if fields:
                rules.append(_rule(number, fields, maps, base_dir, reader, line_problems))
        except HbaSyntaxError as exc:
            line_problems.append(f"{exc}; line skipped")
        problems.extend(f"{path}:{number}: {problem}" for problem in line_problems)
    return HbaRules(tuple(rules)), problems


def _no_files(path: str) -> str:
    raise FileNotFoundError(2, "No such file or directory", path)


# --- ident maps -----------------------------------------------------------------------------


@dataclass(frozen=True)
class IdentMaps:
    """auth_ident_file: map name -> (system user, database user or None for `all`)."""

    maps: dict[str, tuple[tuple[str, str | None], ...]] = field(default_factory=dict)

    def allows(self, map_name: str, system_user: str, user: str) -> bool:
        """Whether map `map_name` lets OS (or certificate) user `system_user` log in as
        `user`."""
        return any(system == system_user and (target is None or target == user)
                   for system, target in self.maps.get(map_name, ()))


def parse_ident(text: str, path: str = "pg_ident.conf") -> tuple[IdentMaps, list[str]]:
    """The maps of an ident file's `text`, and its problems (`path:line: what`)."""
    maps: dict[str, list[tuple[str, str | None]]] = {}
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            fields = tokens(line)
        except HbaSyntaxError as exc:
            problems.append(f"{path}:{number}: {exc}; line skipped")
            continue
        if not fields:
            continue
        if len(fields) != 3 or fields[0].quoted or any(f.is_comma for f in fields):
            problems.append(f"{path}:{number}: expected MAPNAME SYSTEM-USER DATABASE-USER; "
                            "line skipped")
            continue
        name, system, target = fields
        user = None if target.keyword("all") else target.text
        maps.setdefault(name.text, []).append((system.text, user))
    return IdentMaps({name: tuple(entries) for name, entries in maps.items()}), problems
