"""net/records.py: the records declare exactly the calls made on a connection (and on a
client's login) from outside it, and the connection classes carry out every one."""

import ast
from pathlib import Path

import pytest

from pypool.net.client import ClientConnection
from pypool.net.client_login import ClientLogin
from pypool.net.records import ClientLoginSteps, ClientRecord, ServerRecord
from pypool.net.server import ServerConnection

PYPOOL = Path(__file__).resolve().parent.parent.parent / "pypool"
NET = PYPOOL / "net"

# (the record, what carries it out: its module and class, the name callers hold it by)
SIDES = [
    (ClientRecord, ClientConnection, "client.py", "client"),
    (ServerRecord, ServerConnection, "server.py", "server"),
    (ClientLoginSteps, ClientLogin, "client_login.py", "login"),
]


def _methods(path: Path, name: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    return {node.name: node for node in cls.body if isinstance(node, ast.FunctionDef)}


def _declared(record: type) -> set[str]:
    """The record's methods whose body only raises NotImplementedError."""
    return {name for name, node in _methods(NET / "records.py", record.__name__).items()
            if len(node.body) == 1 and isinstance(node.body[0], ast.Raise)}


def _called_from_outside(module: str, holder: str) -> set[str]:
    """`<holder>.<name>(...)` (or `x.<holder>.<name>(...)`) in net/ and pooler/, outside
    `module` and records.py."""
    called: set[str] = set()
    for path in [*NET.glob("*.py"), *(PYPOOL / "pooler").glob("*.py")]:
        if path.parent == NET and path.name in (module, "records.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            held = node.func.value
            name = held.id if isinstance(held, ast.Name) else getattr(held, "attr", None)
            if name == holder:
                called.add(node.func.attr)
    return called


@pytest.mark.parametrize(("record", "connection", "module", "holder"), SIDES,
                         ids=[side[0].__name__ for side in SIDES])
def test_the_declared_calls_are_exactly_those_made(record: type, connection: type, module: str,
                                                   holder: str) -> None:
    own = set(_methods(NET / module, connection.__name__))
    assert _declared(record) == _called_from_outside(module, holder) & own


@pytest.mark.parametrize(("record", "connection", "module", "holder"), SIDES,
                         ids=[side[0].__name__ for side in SIDES])
def test_the_connection_carries_out_every_declared_call(record: type, connection: type,
                                                        module: str, holder: str) -> None:
    declared = _declared(record)
    assert declared
    missing = {name for name in declared if getattr(connection, name) is getattr(record, name)}
    assert missing == set()
    assert declared <= set(_methods(NET / module, connection.__name__))


def test_the_scan_sees_the_hot_calls() -> None:
    assert {"write", "fail", "relay"} <= _declared(ClientRecord)
    assert {"send", "on", "close"} <= _declared(ServerRecord)
    assert "write" in _called_from_outside("client.py", "client")  # server.py's _relay
