"""The mypyc-compiled hot path (pypool/compiled.py): loaded when built, and the way back.

The rest of the suite runs whatever the install produced (compiled, where a C compiler
was there). These tests check the switch itself, and run the sans-IO core's tests and the
randomized model test a second time as Python, so both forms of the same source are held
to the same outcomes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pypool import compiled

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parent.parent
# Imports every hot module; prints the status, then whether all came from extensions.
IMPORT_ALL = (
    "import importlib, importlib.machinery, pypool; from pypool import compiled; "
    "suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES); "
    "files = [importlib.import_module(name).__file__ for name in compiled.HOT_MODULES]; "
    "print(compiled.status); print(all(file.endswith(suffixes) for file in files))"
)

built = all(compiled.extension_path(name) is not None for name in compiled.HOT_MODULES)
needs_build = pytest.mark.skipif(
    not built and os.environ.get("CI") != "true",
    reason="hot path not compiled (no C compiler at install); CI requires it",
)


def run_python(code: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, **(env or {})), cwd=cwd,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@needs_build
def test_install_compiled_every_hot_module_and_they_load() -> None:
    missing = [name for name in compiled.HOT_MODULES if compiled.extension_path(name) is None]
    assert not missing, f"not compiled at install: {missing}"
    status, loaded = run_python(IMPORT_ALL, env={"PYPOOL_PURE": ""})
    assert status == f"compiled with mypyc ({len(compiled.HOT_MODULES)} modules)"
    assert loaded == "True"


@needs_build
def test_pypool_pure_loads_the_python_source() -> None:
    status, loaded = run_python(
        IMPORT_ALL + "; import pypool.pooling.prepared as p; print(p.__file__)",
        env={"PYPOOL_PURE": "1"},
    )[:2]
    assert status == "pure Python (PYPOOL_PURE=1)"
    assert loaded == "False"


def compiled_copy(tmp_path: Path, checkout: bool) -> Path:
    """A copy of the compiled package (and its group library): a source checkout's when
    `checkout` (pyproject.toml beside it), else laid out as a wheel installs it."""
    copy = tmp_path / "tree"
    shutil.copytree(REPO / "pypool", copy / "pypool")
    group = compiled.group_library()
    assert group is not None, "the compiled group's shared library is missing"
    shutil.copy2(group, copy / group.name)
    if checkout:
        shutil.copy2(REPO / "pyproject.toml", copy / "pyproject.toml")
    return copy


def import_from(copy: Path) -> list[str]:
    return run_python(
        IMPORT_ALL + "; import pypool.net.pipeline as p; print(p.__file__)",
        env={"PYTHONPATH": str(copy), "PYPOOL_PURE": ""}, cwd=copy.parent,
    )


@needs_build
def test_an_edit_after_compiling_falls_back_to_the_source(tmp_path: Path) -> None:
    """Edit one module of a compiled checkout: all of them load as Python, and the log says
    why."""
    copy = compiled_copy(tmp_path, checkout=True)
    edited = copy / "pypool" / "net" / "pipeline.py"
    future = time.time() + 60
    os.utime(edited, (future, future))
    lines = import_from(copy)
    assert lines[0] == (
        "pure Python (pypool.net.pipeline edited since compiled; run `pip install -e .` again)"
    )
    assert lines[1] == "False"
    assert lines[2] == str(edited)


@needs_build
def test_a_wheel_install_stays_compiled_whatever_the_file_times(tmp_path: Path) -> None:
    """pip writes each .py after its .so: outside a checkout, file times are not edits."""
    copy = compiled_copy(tmp_path, checkout=False)
    future = time.time() + 60
    for module in compiled.HOT_MODULES:
        os.utime(copy / compiled.source_path(module).relative_to(compiled.ROOT),
                 (future, future))
    lines = import_from(copy)
    assert lines[:2] == [f"compiled with mypyc ({len(compiled.HOT_MODULES)} modules)", "True"]


@needs_build
def test_without_the_group_library_the_source_is_used(tmp_path: Path) -> None:
    """The modules' shared library failed to build: load them as Python, not fail to start."""
    copy = compiled_copy(tmp_path, checkout=False)
    group = compiled.group_library()
    assert group is not None
    (copy / group.name).unlink()
    lines = import_from(copy)
    assert lines[0] == "pure Python (only part of the build is there; run `pip install -e .` again)"
    assert lines[1] == "False"


@needs_build
def test_the_sans_io_core_and_the_model_test_pass_as_python() -> None:
    tests = ["tests/pooling", "tests/protocol", "tests/integration/test_prepared_model.py",
             "tests/integration/test_pipeline.py"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        capture_output=True, text=True, timeout=540, cwd=REPO,
        env=dict(os.environ, PYPOOL_PURE="1"),
    )
    assert out.returncode == 0, out.stdout[-4000:]
    assert " passed" in out.stdout.splitlines()[-1]


def test_no_hot_function_reuses_an_except_name_for_another_exception_type() -> None:
    """mypyc types `except A as exc` by its first binding; a second `except B as exc` in the
    same function then raises TypeError when B is caught (it hid a server connect timeout)."""
    import ast

    reused = []
    for module in compiled.HOT_MODULES:
        tree = ast.parse(compiled.source_path(module).read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            types: dict[str, set[str]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.ExceptHandler) and node.name and node.type:
                    types.setdefault(node.name, set()).add(ast.unparse(node.type))
            reused += [f"{module}.{function.name}: {name}" for name, seen in types.items()
                       if len(seen) > 1]
    assert not reused
