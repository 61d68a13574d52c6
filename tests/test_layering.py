"""The sans-IO core (protocol/, auth/, pooling/) never imports asyncio or opens sockets."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pypool"
SANS_IO = ("protocol", "auth", "pooling")
FORBIDDEN = {"asyncio", "uvloop", "socket", "selectors"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level > 0 and node.module:
            # A relative import reaching into the asyncio layer counts too.
            if node.module.split(".")[0] in ("net", "admin"):
                names.add("pypool.net")
    return names


@pytest.mark.parametrize(
    "path",
    sorted(p for layer in SANS_IO for p in (PACKAGE / layer).rglob("*.py")),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_sans_io_modules_import_no_io(path: Path) -> None:
    bad = _imports(path) & (FORBIDDEN | {"pypool.net"})
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_scan_sees_the_core() -> None:
    files = [p for layer in SANS_IO for p in (PACKAGE / layer).rglob("*.py")]
    assert len(files) >= 8
