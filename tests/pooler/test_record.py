"""pooler/record.py: PoolerRecord declares exactly the calls made into the pooler, and the
Pooler carries out every one."""

import ast
from pathlib import Path

from pypool.pooler.objects import Pooler
from pypool.pooler.record import PoolerRecord

POOLER = Path(__file__).resolve().parent.parent.parent / "pypool" / "pooler"
NET = POOLER.parent / "net"


def _methods(path: Path, name: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    return {node.name: node for node in cls.body if isinstance(node, ast.FunctionDef)}


def _declared() -> set[str]:
    """The record's methods whose body only raises NotImplementedError."""
    return {name for name, node in _methods(POOLER / "record.py", "PoolerRecord").items()
            if isinstance(node.body[-1], ast.Raise) and len(node.body) == 1}


def _fields() -> set[str]:
    init = _methods(POOLER / "record.py", "PoolerRecord")["__init__"]
    return {node.attr for node in ast.walk(init)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "self" and isinstance(node.ctx, ast.Store)}


def _used_by_the_parts() -> set[str]:
    """`pooler.<name>` in pooler/'s modules other than objects.py and record.py."""
    used: set[str] = set()
    for path in POOLER.glob("*.py"):
        if path.name in ("objects.py", "record.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "pooler"):
                used.add(node.attr)
    return used


def test_the_declared_calls_are_exactly_those_made() -> None:
    port = set(_methods(NET / "records.py", "PoolerPort"))
    defined = set(_methods(POOLER / "record.py", "PoolerRecord")) - _declared()
    wanted = (_used_by_the_parts() | port) - defined - _fields()
    assert _declared() == wanted


def test_the_pooler_carries_out_every_declared_call() -> None:
    declared = _declared()
    assert {"launch_servers", "close_server", "ready_for_query"} <= declared
    missing = {name for name in declared
               if getattr(Pooler, name) is getattr(PoolerRecord, name)}
    assert missing == set()
    assert declared <= set(_methods(POOLER / "objects.py", "Pooler"))
