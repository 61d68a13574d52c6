"""The link's table (core/link.py): every transition, every illegal pair, the ReadyForQuery
verdict, and the diagram in docs/link.md made from the table."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

from pypool.core import link as lk
from pypool.core.ledger import FrontendLedger
from pypool.core.link import LINK_TABLE, Link, LinkEvent, LinkState, ready_event
from pypool.core.states import ClientState, IllegalTransition
from pypool.protocol import messages as m

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
EVENTS = range(len(LinkEvent.NAMES))


def at(state: LinkState) -> Link:
    return Link(state)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(LinkState, EVENTS)),
                         ids=lambda x: x.name if isinstance(x, LinkState) else LinkEvent.NAMES[x])
def test_every_pair_moves_as_the_table_says_or_raises(state: LinkState, event: int) -> None:
    link = at(state)
    if (state, event) in LINK_TABLE:
        target, actions = LINK_TABLE[state, event]
        assert link.on(event) == actions
        assert link.state is target
    else:
        with pytest.raises(IllegalTransition, match=f"{state.name} on {LinkEvent.NAMES[event]}"):
            link.on(event)
        assert link.state is state  # an illegal event changes nothing


def test_a_transaction_that_waits_for_a_server_and_its_set() -> None:
    link = Link()
    assert link.on(LinkEvent.QUEUED) == 0 and link.state is LinkState.WAITING
    assert link.on(LinkEvent.LINKED_TO_SET) == lk.HOLD and link.state is LinkState.SETTING
    assert link.on(LinkEvent.APPLIED) == lk.SEND and link.state is LinkState.ACTIVE
    assert link.on(LinkEvent.READY_IN_TRANSACTION) == 0 and link.state is LinkState.ACTIVE
    assert link.on(LinkEvent.READY_RELEASE) == lk.RELEASE and link.state is LinkState.IDLE


def test_a_failed_check_unlinks_closes_that_server_and_asks_again() -> None:
    link = at(LinkState.SETTING)
    actions = link.on(LinkEvent.CHECK_FAILED)
    assert lk.action_names(actions) == ["UNLINK", "CLOSE_SERVER", "ASK_AGAIN"]
    assert link.state is LinkState.IDLE


def test_a_release_after_shutdown_also_ends_the_client() -> None:
    link = at(LinkState.ACTIVE)
    assert link.on(LinkEvent.SHUTDOWN) == lk.MARK_LAST and link.last
    ledger = FrontendLedger()
    ledger.request(m.QUERY)
    assert ledger.ready()
    event = ready_event(ledger, m.TX_IDLE, "transaction", link, False)
    assert event == LinkEvent.READY_RELEASE_LAST
    assert link.on(event) == lk.RELEASE | lk.CLOSE_CLIENT


def test_a_drain_ends_session_mode_and_pinned_clients_at_their_boundary() -> None:
    """What keeps a server across transactions (session mode, session state) does not keep
    a draining client: its ReadyForQuery 'I' releases and ends it; inside a transaction
    it stays; a client gone is judged as before."""
    for mode, pinned in (("session", False), ("transaction", True)):
        link = at(LinkState.ACTIVE)
        assert link.on(LinkEvent.DRAIN) == lk.MARK_LAST | lk.MARK_DRAIN
        assert link.last and link.draining
        assert ready_event(owed_nothing(), m.TX_IN_BLOCK, mode, link, False, 0, pinned) == (
            LinkEvent.READY_IN_TRANSACTION)
        assert ready_event(owed_nothing(), m.TX_IDLE, mode, link, False, 0, pinned) == (
            LinkEvent.READY_RELEASE_LAST)
        link.on(LinkEvent.GONE)
        assert ready_event(owed_nothing(), m.TX_IDLE, mode, link, False, 0, pinned) == (
            LinkEvent.READY_SESSION if mode == "session" else LinkEvent.READY_RELEASE_LAST)


def test_pgbouncer_s_shutdown_keeps_session_mode_and_pinned_clients() -> None:
    """SIGINT as PgBouncer's (no drain): a session-mode or pinned client keeps its server
    past its transactions, so the exit waits for it to leave."""
    for mode, pinned, event in (("session", False, LinkEvent.READY_SESSION),
                                ("transaction", True, LinkEvent.READY_PINNED),
                                ("transaction", False, LinkEvent.READY_RELEASE_LAST)):
        link = at(LinkState.ACTIVE)
        link.on(LinkEvent.SHUTDOWN)
        assert link.last and not link.draining
        assert ready_event(owed_nothing(), m.TX_IDLE, mode, link, False, 0, pinned) == event


def test_shutdown_of_an_idle_client_is_not_a_link_event() -> None:
    # An idle client holds no transaction: the shutdown ends it at once, not at a release.
    with pytest.raises(IllegalTransition):
        Link().on(LinkEvent.SHUTDOWN)


def test_a_client_in_a_line_owns_the_server_at_its_turn() -> None:
    link = at(LinkState.WAITING)
    assert link.on(LinkEvent.LINED_UP) == lk.SEND and link.state is LinkState.IN_LINE
    with pytest.raises(IllegalTransition):
        link.on(LinkEvent.READY_RELEASE)  # its replies come only after its turn
    assert link.on(LinkEvent.TURN) == 0 and link.state is LinkState.ACTIVE


def test_a_client_gone_in_a_line_is_still_judged_at_its_ready_for_query() -> None:
    link = at(LinkState.IN_LINE)
    link.on(LinkEvent.GONE)
    assert link.on(LinkEvent.TURN) == 0
    assert link.on(LinkEvent.READY_RELEASE) == lk.RELEASE  # the line moves on
    assert link.state is LinkState.CLOSED
    with pytest.raises(IllegalTransition):
        link.on(LinkEvent.QUEUED)


def test_closed_is_final_and_every_other_state_can_end() -> None:
    for state in LinkState:
        if state is LinkState.CLOSED:
            assert all(LINK_TABLE[state, e][0] is LinkState.CLOSED
                       for e in EVENTS if (state, e) in LINK_TABLE)
        else:
            assert LINK_TABLE[state, LinkEvent.GONE] == (LinkState.CLOSED, 0)


def test_every_state_and_event_is_used_and_each_shows_as_a_client_state() -> None:
    assert {s for s, _ in LINK_TABLE} | {t for t, _ in LINK_TABLE.values()} == set(LinkState)
    assert {e for _, e in LINK_TABLE} == set(EVENTS)
    shown = {state: Link(state).shown for state in LinkState}
    assert shown[LinkState.IDLE] is ClientState.IDLE
    assert shown[LinkState.WAITING] is ClientState.WAITING
    assert {shown[s] for s in (LinkState.SETTING, LinkState.ACTIVE, LinkState.IN_LINE)} == {
        ClientState.ACTIVE}


# --- what a ReadyForQuery that leaves the client owed nothing means --------------------------


def owed_nothing() -> FrontendLedger:
    ledger = FrontendLedger()
    ledger.request(m.QUERY)
    assert ledger.ready()
    return ledger


T, E_ = ord("T"), ord("E")


@pytest.mark.parametrize(("status", "mode", "state", "chained", "pinned", "event"), [
    (m.TX_IDLE, "transaction", LinkState.ACTIVE, False, False, LinkEvent.READY_RELEASE),
    (m.TX_IDLE, "statement", LinkState.ACTIVE, False, False, LinkEvent.READY_RELEASE),
    (m.TX_IDLE, "session", LinkState.ACTIVE, False, False, LinkEvent.READY_SESSION),
    (m.TX_IDLE, "transaction", LinkState.ACTIVE, False, True, LinkEvent.READY_PINNED),
    (m.TX_IDLE, "transaction", LinkState.CLOSED, False, True, LinkEvent.READY_RELEASE),
    (T, "transaction", LinkState.ACTIVE, False, False, LinkEvent.READY_IN_TRANSACTION),
    (T, "session", LinkState.ACTIVE, False, False, LinkEvent.READY_IN_TRANSACTION),
    (T, "statement", LinkState.ACTIVE, False, False, LinkEvent.READY_REFUSED),
    (T, "transaction", LinkState.CLOSED, False, False, LinkEvent.READY_OPEN),
    (E_, "transaction", LinkState.ACTIVE, True, False, LinkEvent.READY_OPEN),
])
def test_ready_event(status: int, mode: str, state: LinkState, chained: bool, pinned: bool,
                     event: int) -> None:
    link = at(state)
    assert ready_event(owed_nothing(), status, mode, link, chained, 0, pinned) == event
    link.on(event)  # and the table takes it from that state


def test_a_doubtful_ledger_or_a_queue_left_waiting_closes_the_server() -> None:
    ledger = owed_nothing()
    assert ready_event(ledger, m.TX_IDLE, "transaction", Link(), False, 1) == (
        LinkEvent.READY_DOUBT)
    ledger.doubtful = True
    assert ready_event(ledger, m.TX_IDLE, "transaction", Link(), False) == LinkEvent.READY_DOUBT
    assert at(LinkState.ACTIVE).on(LinkEvent.READY_DOUBT) == lk.CLOSE_SERVER


# --- the diagram and the one place that moves a link ---------------------------------------


def test_the_diagram_in_docs_is_the_table() -> None:
    doc = (ROOT / "docs" / "link.md").read_text()
    block = re.search(r"```mermaid\n(.*?)```", doc, re.S)
    assert block is not None
    assert block.group(1) == lk.diagram()


def test_no_link_state_is_written_outside_the_table() -> None:
    offenders = []
    for path in (ROOT / "pypool").rglob("*.py"):
        if path.name == "link.py" and path.parent.name == "core":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\blink\.(state|last|draining)\s*=(?!=)|close_after_release|setting_for",
                         line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


# --- the link's two pointers and the reader's hold: one writer (net/link_ends.py) ----------

OWNER = ROOT / "pypool" / "net" / "link_ends.py"
# The classes whose own `self.server` / `self.client` are a link's ends (set up in __init__).
RECORDS = {"ClientRecord", "ServerRecord", "ClientConnection", "ServerConnection"}


def _assigned(tree: ast.AST) -> list[tuple[ast.Attribute, str, str]]:
    """Every attribute assigned in `tree`, with its enclosing class and function names."""
    found: list[tuple[ast.Attribute, str, str]] = []

    def visit(node: ast.AST, cls: str, func: str) -> None:
        if isinstance(node, ast.ClassDef):
            names = {node.name} | {getattr(base, "id", getattr(base, "attr", ""))
                                   for base in node.bases}
            cls = node.name if names & RECORDS else ""  # "": not a record's own fields
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        while targets:
            target = targets.pop()
            if isinstance(target, (ast.Tuple, ast.List)):
                targets.extend(target.elts)
            elif isinstance(target, ast.Starred):
                targets.append(target.value)
            elif isinstance(target, ast.Attribute):
                found.append((target, cls, func))
        for child in ast.iter_child_nodes(node):
            visit(child, cls, func)

    visit(tree, "", "")
    return found


def _link_end_writes(path: Path, source: str | None = None) -> list[str]:
    """Where `path` (or `source`, read as that file) assigns a link's end (`x.server`,
    `x.client` of a client or server) or a request reader's hold (`reader.blocked`,
    `x.reader.blocked`)."""
    text = path.read_text() if source is None else source
    out = []
    for target, cls, func in _assigned(ast.parse(text, str(path))):
        value = target.value
        is_self = isinstance(value, ast.Name) and value.id == "self"
        if target.attr in ("server", "client"):
            # Another object's `self.server` (a TLS context, a replication pipe) is no link.
            hit = (not is_self) or (cls in RECORDS and func != "__init__")
        elif target.attr == "blocked":
            # The RequestReader's own `self.blocked` is its rewriting WAIT (core/frontend.py).
            hit = ((isinstance(value, ast.Name) and value.id == "reader")
                   or (isinstance(value, ast.Attribute) and value.attr == "reader"))
        else:
            hit = False
        if hit:
            out.append(f"{path.relative_to(ROOT)}:{target.lineno}: {ast.unparse(target)}")
    return out


def test_only_link_ends_writes_the_link_s_pointers_and_the_reader_s_hold() -> None:
    """client.server, server.client and reader.blocked are written in net/link_ends.py alone;
    everywhere else calls its named steps (link, unlink, line_up, take_turn, hold, ...)."""
    offenders = [hit for path in sorted((ROOT / "pypool").rglob("*.py")) if path != OWNER
                 for hit in _link_end_writes(path)]
    assert offenders == []


def test_the_pointer_scan_sees_the_writes() -> None:
    """The scan finds what the owner writes, and would find a write moved back elsewhere
    (not a record's own __init__, nor another object's `self.server`)."""
    written = {line.rsplit(": ", 1)[1] for line in _link_end_writes(OWNER)}
    assert {"client.server", "server.client", "client.reader.blocked",
            "last.reader.blocked"} <= written
    probe = ("class ServerConnection(ServerRecord):\n"
             "    def __init__(self):\n        self.client = None\n"
             "    def link(self, client):\n        self.client = client\n"
             "class Pipe:\n    def reset(self):\n        self.server = None\n"
             "def f(c, s, reader, st):\n    c.server, s.client = s, c\n"
             "    reader.blocked = True\n    c.reader.blocked = False\n"
             "    st.requests.blocked = False\n")
    flagged = {line.split(": ", 1)[1]
               for line in _link_end_writes(ROOT / "pypool" / "probe.py", probe)}
    assert flagged == {"self.client", "c.server", "s.client", "reader.blocked",
                       "c.reader.blocked"}
