"""net/records.py: PoolerPort lists exactly what net/ reads and calls on the running pooler."""

import ast
from pathlib import Path

NET = Path(__file__).resolve().parent.parent.parent / "pypool" / "net"


def _port_class(tree: ast.Module) -> ast.ClassDef:
    return next(node for node in tree.body
                if isinstance(node, ast.ClassDef) and node.name == "PoolerPort")


def _port_members() -> set[str]:
    port = _port_class(ast.parse((NET / "records.py").read_text()))
    fields = {node.target.id for node in port.body
              if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    methods = {node.name for node in port.body if isinstance(node, ast.FunctionDef)}
    return fields | methods


def _is_the_pooler(node: ast.expr) -> bool:
    """`pooler`, or `<connection>.pooler` (not `settings.pooler`, the [pgbouncer] section)."""
    if isinstance(node, ast.Name):
        return node.id == "pooler"
    return (isinstance(node, ast.Attribute) and node.attr == "pooler"
            and not (isinstance(node.value, ast.Attribute) and node.value.attr == "settings")
            and not (isinstance(node.value, ast.Name) and node.value.id == "settings"))


def _used_by_net() -> set[str]:
    used: set[str] = set()
    for path in NET.glob("*.py"):  # records.py too: the records read the pooler's fields
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _is_the_pooler(node.value):
                used.add(node.attr)
    return used


def test_the_port_is_exactly_what_net_uses() -> None:
    members, used = _port_members(), _used_by_net()
    assert used - members == set(), "net/ uses what the port does not list"
    assert members - used == set(), "the port lists what net/ no longer uses"


def test_the_scan_sees_the_calls() -> None:
    used = _used_by_net()
    assert {"request_server", "ready_for_query", "client_closed", "now"} <= used
    assert "max_packet_size" not in used  # settings.pooler.max_packet_size is a setting
