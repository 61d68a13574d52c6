"""The sans-IO core (core/, protocol/, auth/, pooling/) never imports asyncio or opens sockets."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pypool"
SANS_IO = ("core", "protocol", "auth", "pooling")
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
            if node.module.split(".")[0] in ("net", "pooler", "admin"):
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


# --- no cycle between the network layer and the console and metrics above it ---------------


def _modules_imported(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (inside functions and TYPE_CHECKING
    blocks too), as absolute dotted names: `from ..admin import show` in pypool/net/x.py
    gives pypool.admin and pypool.admin.show."""
    package = ["pypool", *path.relative_to(PACKAGE).parent.parts]
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _reaches(names: set[str], targets: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == t or n.startswith(t + ".") for t in targets))


ABOVE_NET = ("pypool.admin", "pypool.metrics", "pypool.observe")


@pytest.mark.parametrize(
    "path", sorted([*(PACKAGE / "net").rglob("*.py"), *(PACKAGE / "pooler").rglob("*.py")]),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_the_network_layer_never_imports_the_console_or_metrics(path: Path) -> None:
    """net/ and pooler/ call the console and metrics only through the hooks cli.py sets at
    start-up."""
    bad = _reaches(_modules_imported(path), ABOVE_NET)
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize(
    "path",
    sorted([*(PACKAGE / "admin").rglob("*.py"), PACKAGE / "metrics.py",
            *(PACKAGE / "observe").rglob("*.py")]),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_console_and_metrics_read_the_pooler_through_the_view(path: Path) -> None:
    """admin/, metrics.py and observe/ never import net/ or pooler/, not even for type
    checking: they see the pooler through observe/view.py's Protocols."""
    bad = _reaches(_modules_imported(path), ("pypool.net", "pypool.pooler"))
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "observe").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_view_is_plain_data(path: Path) -> None:
    """observe/ takes snapshots; it has no event loop, no sockets and no console."""
    names = _modules_imported(path)
    bad = _reaches(names, ("asyncio", "uvloop", "socket", "selectors", "pypool.admin",
                           "pypool.metrics"))
    assert not bad, f"{path.name} imports {bad}"


def test_the_cycle_scan_sees_its_files() -> None:
    assert len(list((PACKAGE / "net").rglob("*.py"))) >= 5
    assert len(list((PACKAGE / "pooler").rglob("*.py"))) >= 5
    assert (PACKAGE / "observe" / "view.py").exists()
    # The scan resolves relative imports: it would catch the imports this change removed.
    probe = PACKAGE / "pooler" / "objects.py"
    assert "pypool.net.client" in _modules_imported(probe)


# --- no import cycle inside pooling/prepared/ --------------------------------------------------


def _module_name(path: Path) -> str:
    parts = ["pypool", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _a_cycle(edges: dict[str, list[str]]) -> list[str]:
    """A cycle in `edges` (module -> the modules it imports), or [] when there is none."""
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> list[str]:
        if name in trail:
            return [*trail[trail.index(name):], name]
        if name in done:
            return []
        for target in edges[name]:
            cycle = visit(target, [*trail, name])
            if cycle:
                return cycle
        done.add(name)
        return []

    for name in sorted(edges):
        cycle = visit(name, [])
        if cycle:
            return cycle
    return []


def _import_graph(paths: list[Path]) -> dict[str, list[str]]:
    """Which of the modules at `paths` each imports (TYPE_CHECKING and function-local
    imports included)."""
    modules = {_module_name(path): path for path in paths}
    return {name: sorted(n for n in _modules_imported(path) if n in modules and n != name)
            for name, path in modules.items()}


def test_prepared_statements_have_no_import_cycle() -> None:
    """pooling/prepared/ reads bottom up: registry, requests, the request queue, the cache,
    SQL-level names, the guard's statement, the rewriter. No module imports one above it,
    not even for type checking (registry.py once imported the pipelining guard, which
    imported the rewriting's layers, which imported registry.py)."""
    paths = sorted((PACKAGE / "pooling" / "prepared").glob("*.py"))
    assert len(paths) >= 8
    graph = _import_graph([*paths, PACKAGE / "pooling" / "pipeline_guard.py"])
    assert "pypool.pooling.prepared.registry" in graph["pypool.pooling.prepared.cache"]
    cycle = _a_cycle(graph)
    assert not cycle, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _a_cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": ["b", "c"], "b": ["c"], "c": []}) == []
