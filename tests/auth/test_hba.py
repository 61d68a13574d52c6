"""auth_hba_file and auth_ident_file: parsing PgBouncer's pg_hba.conf subset and matching
logins against it, fed text, no files or sockets."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypool.auth.hba import HbaRules, Login, parse_hba, parse_ident, tokens

pytestmark = pytest.mark.timeout(30)


def rules_of(text: str, **kwargs: object) -> HbaRules:
    rules, problems = parse_hba(text, "/etc/pypool/hba.conf", **kwargs)  # type: ignore[arg-type]
    assert problems == []
    return rules


def tcp(database: str, user: str, address: str = "127.0.0.1", tls: bool = False) -> Login:
    return Login(address, tls, database, user)


def unix(database: str, user: str) -> Login:
    return Login(None, False, database, user)


def line_of(rules: HbaRules, login: Login) -> int | None:
    rule = rules.match(login)
    return None if rule is None else rule.line


# --- the rules' fields ----------------------------------------------------------------------


def test_the_first_fitting_line_decides() -> None:
    rules = rules_of(
        "# type db user address method\n"
        "local all postgres peer\n"
        "host  app alice 10.0.0.0/8 reject\n"
        "host  app all   10.0.0.0/8 scram-sha-256\n"
        "host  all all   all        md5\n"
    )
    assert rules.match(unix("app", "postgres")).method == "peer"  # type: ignore[union-attr]
    assert line_of(rules, unix("app", "alice")) is None  # no other local line
    assert rules.match(tcp("app", "alice", "10.1.2.3")).method == "reject"  # type: ignore[union-attr]
    assert rules.match(tcp("app", "bob", "10.1.2.3")).method == "scram-sha-256"  # type: ignore[union-attr]
    assert rules.match(tcp("app", "alice", "192.168.0.1")).method == "md5"  # type: ignore[union-attr]


def test_password_means_cleartext() -> None:
    assert rules_of("host all all all password\n").rules[0].method == "plain"


def test_hostssl_only_for_tls_and_hostnossl_only_without() -> None:
    rules = rules_of("hostssl all all all cert\nhostnossl all all all trust\n")
    assert line_of(rules, tcp("db", "u", tls=True)) == 1
    assert line_of(rules, tcp("db", "u", tls=False)) == 2
    assert line_of(rules, unix("db", "u")) is None


def test_lists_sameuser_and_quoted_keywords() -> None:
    rules = rules_of(
        'host sales,"all" ann,"bo b" all trust\n'
        "host sameuser all all md5\n"
    )
    assert line_of(rules, tcp("all", "ann")) == 1  # "all" in quotes is a database name
    assert line_of(rules, tcp("sales", "bo b")) == 1
    assert line_of(rules, tcp("other", "ann")) is None
    assert line_of(rules, tcp("carl", "carl")) == 2


def test_replication_matches_physical_replication_only() -> None:
    rules = rules_of("host replication all all trust\nhost all all all reject\n")
    assert line_of(rules, Login("127.0.0.1", False, "replication", "u", replication=True)) == 1
    # An ordinary connection to a database called "replication" is not a replication one.
    assert line_of(rules, tcp("replication", "u")) == 2
    # ... and `all` does not cover replication connections.
    only_all = rules_of("host all all all trust\n")
    assert line_of(only_all, Login("127.0.0.1", False, "db", "u", replication=True)) is None


def test_at_file_names_are_read_beside_the_hba_file() -> None:
    asked: list[str] = []

    def read(path: str) -> str:
        asked.append(path)
        return "carol, dave\n# a comment\nerin\n"

    rules = rules_of("host all @staff.txt all trust\n", read_names=read)
    assert asked == ["/etc/pypool/staff.txt"]
    assert rules.rules[0].users.names == {"carol", "dave", "erin"}


def test_ipv4_and_ipv6_with_prefix_or_mask() -> None:
    rules = rules_of(
        "host all all 192.168.1.0 255.255.255.0 trust\n"
        "host all all fe80::/16 md5\n"
        "host all all 10.0.0.1/32 password\n"
    )
    assert line_of(rules, tcp("d", "u", "192.168.1.77")) == 1
    assert line_of(rules, tcp("d", "u", "192.168.2.1")) is None
    assert line_of(rules, tcp("d", "u", "fe80::1")) == 2
    assert line_of(rules, tcp("d", "u", "10.0.0.1")) == 3
    assert line_of(rules, tcp("d", "u", "10.0.0.2")) is None
    # An IPv4 rule never covers an IPv6 client, nor the other way round.
    assert line_of(rules_of("host all all 0.0.0.0/0 trust\n"), tcp("d", "u", "::1")) is None


def test_map_option_needs_a_known_map() -> None:
    maps, problems = parse_ident("office alice alice\noffice root all\n")
    assert problems == []
    rules = rules_of("local all all peer map=office\n", maps=maps)
    assert rules.rules[0].map == "office"
    assert maps.allows("office", "root", "anyone")
    assert maps.allows("office", "alice", "alice")
    assert not maps.allows("office", "alice", "bob")
    assert not maps.allows("elsewhere", "root", "root")


# --- what is refused, and how ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("hostgssenc all all all trust", "unknown type"),
        ("host samerole all all trust", "samerole is not supported"),
        ("host all +admins all trust", "group names"),
        ("host all all db.example.com trust", "failed to parse address"),
        ("host all all samenet trust", "failed to parse address"),
        ("host all all 10.0.0.0/33 trust", "invalid mask"),
        ("host all all 10.0.0.0 trust", "failed to parse mask"),
        ("host all all all ldap", "unsupported method: ldap"),
        ("local all all peer map=nowhere", "ident map nowhere is not found"),
        ("local all all peer clientcert=1", "not in map=value format"),
        ('local all "unterminated peer', "unterminated quoted string"),
        ("host ,app all all trust", "a comma where a name should be"),
        ("host app", "a name is missing"),
        ("local all all", "did not find the method"),
    ],
)
def test_a_bad_line_is_skipped_and_named(line: str, says: str) -> None:
    rules, problems = parse_hba(f"local all all trust\n{line}\nhost all all all md5\n",
                                "/etc/hba.conf")
    assert [r.line for r in rules.rules] == [1, 3]
    assert len(problems) == 1
    assert problems[0].startswith("/etc/hba.conf:2: ")
    assert says in problems[0]


def test_a_mask_wider_than_the_address_is_kept_with_a_warning() -> None:
    rules, problems = parse_hba("host all all 10.1.0.0/8 trust\n", "hba.conf")
    assert len(rules.rules) == 1
    assert problems == ["hba.conf:1: address does not match mask: 10.1.0.0/8"]
    # As PgBouncer: the address as written is compared, so this rule matches nobody.
    assert line_of(rules, tcp("d", "u", "10.1.0.0")) is None


def test_ident_lines_that_are_not_three_names_are_skipped() -> None:
    maps, problems = parse_ident('m1 "os user" all\nm1 too many fields here\nm2 lonely\n', "id")
    assert maps.allows("m1", "os user", "whoever")
    assert "m2" not in maps.maps
    assert [p.split(":")[1] for p in problems] == ["2", "3"]


# --- properties -----------------------------------------------------------------------------

names = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\n\r"),
                min_size=1, max_size=12)


@given(names)
def test_any_name_in_quotes_reads_back_as_itself(name: str) -> None:
    quoted = '"' + name.replace('"', '""') + '"'
    (token,) = tokens(f"  {quoted}  # trailing comment")
    assert token.text == name and token.quoted


rule_lines = st.tuples(
    st.sampled_from(["local", "host", "hostssl", "hostnossl"]),
    st.sampled_from(["all", "app", "sameuser", "app,other"]),
    st.sampled_from(["all", "alice", "alice,bob"]),
    st.sampled_from(["all", "127.0.0.0/8", "10.0.0.0/8", "::1/128", "0.0.0.0/0"]),
    st.sampled_from(["trust", "reject", "md5", "scram-sha-256", "password", "peer"]),
)
logins = st.builds(
    Login,
    address=st.sampled_from([None, "127.0.0.1", "10.9.8.7", "::1", "192.0.2.1"]),
    tls=st.booleans(),
    database=st.sampled_from(["app", "other", "alice", "x"]),
    user=st.sampled_from(["alice", "bob", "carol"]),
)


def _text(line: tuple[str, str, str, str, str]) -> str:
    kind, database, user, address, method = line
    return f"{kind} {database} {user} {'' if kind == 'local' else address} {method}"


@settings(max_examples=300, deadline=None)
@given(st.lists(rule_lines, min_size=0, max_size=8), logins)
def test_the_match_is_the_first_line_that_fits_on_its_own(
    lines: list[tuple[str, str, str, str, str]], login: Login
) -> None:
    rules = rules_of("\n".join(_text(line) for line in lines) + "\n")
    alone = [rule for rule in rules.rules if HbaRules((rule,)).match(login) is not None]
    assert rules.match(login) == (alone[0] if alone else None)


@settings(max_examples=300, deadline=None)
@given(st.ip_addresses(), st.integers(0, 128), st.ip_addresses())
def test_an_address_rule_matches_as_ipaddress_networks_do(
    base: ipaddress.IPv4Address | ipaddress.IPv6Address, bits: int,
    client: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    network = ipaddress.ip_network(f"{base}/{min(bits, base.max_prefixlen)}", strict=False)
    rules = rules_of(f"host all all {network} trust\n")
    expected = client.version == network.version and client in network
    assert (line_of(rules, tcp("d", "u", str(client))) == 1) == expected
