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
    probe = PACKAGE / "pooler" / "lifecycle.py"
    assert "pypool.net.client" in _modules_imported(probe)


# --- net/ sees the pooler only through its port ------------------------------------------


@pytest.mark.parametrize("path", sorted((PACKAGE / "net").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_network_layer_never_imports_the_pooler(path: Path) -> None:
    """net/ calls the running pooler through net/port.py's PoolerPort, never pooler/, not
    even for type checking."""
    bad = _reaches(_modules_imported(path), ("pypool.pooler",))
    assert not bad, f"{path.name} imports {bad}"


# --- no import cycle anywhere ----------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Each module of pypool -> the modules of pypool it imports, anywhere in it (inside
    functions and TYPE_CHECKING blocks too). A module's own enclosing packages are left
    out: they are imported before it, whatever it says."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {n for n in _modules_imported(path)
               if n in files and n != name and not name.startswith(n + ".")}
        for name, path in files.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    without recursion): each is a cycle, or several sharing modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _layer(module: str) -> str:
    """pypool.net.client -> pypool.net; pypool.settings -> pypool.settings."""
    return ".".join(module.split(".")[:2])


LAYERS = sorted({_layer(_module_name(p)) for p in PACKAGE.rglob("*.py")} - {"pypool"})


def test_the_cycle_scan_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("layer", LAYERS)
def test_no_import_cycle_inside(layer: str) -> None:
    """No module of a layer imports, even for type checking or inside a function, one that
    imports it back, directly or through others."""
    inside = [c for c in _cycles(_import_graph()) if {_layer(m) for m in c} == {layer}]
    assert not inside, f"import cycles in {layer}: {inside}"


def test_no_import_cycle_between_layers() -> None:
    across = [c for c in _cycles(_import_graph()) if len({_layer(m) for m in c}) > 1]
    assert not across, f"import cycles across layers: {across}"
