"""The hot path, compiled: which modules mypyc turns into C extensions, and the way back.

The modules below carry every byte of a transaction (framing, the two connections,
pipelining, the pool, the prepared-statement rewriter, the Pooler that links them). They
are plain, fully typed Python and stay the one definition of what pypool does. At install
time `setup.py` also compiles them with mypyc into C extensions that sit beside their `.py`
files and win on import; that halves the interpreter's CPU per transaction
(bench/README.md). Without a C compiler, or with PYPOOL_PURE=1 at install, nothing is
compiled and pypool runs as Python.

They are compiled as one group, and the compiled modules call each other directly in C, so
it is all of them or none. `choose()`, run when the package is imported, falls back to the
Python source of all of them when:
- PYPOOL_PURE=1 is set (to step through the code, profile it as Python, or patch it);
- any of them was edited after it was compiled (in a source checkout, the editable install
  of development: run `pip install -e .` again to recompile). Only there: an install from
  a wheel writes each .py after its .so, so file times say nothing;
- the library the group shares (`<hash>__mypyc`) is missing, so the modules could not load.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

HOT_MODULES = (
    "pypool.protocol.framing",
    "pypool.protocol.messages",
    "pypool.core.ledger",
    "pypool.core.backend",
    "pypool.core.replies",
    "pypool.core.frontend",
    "pypool.core.states",
    "pypool.core.link",
    "pypool.core.exchange",
    "pypool.core.client_login",
    # The login (connect-per-transaction pays it per transaction): SCRAM and its driver.
    "pypool.auth.scram",
    "pypool.auth.server_credentials",
    "pypool.net.client_login",
    "pypool.core.server_login",
    "pypool.pooling.params",
    "pypool.pooling.session_state",
    "pypool.pooling.session_state.commands",
    "pypool.pooling.session_state.tokenizer",
    "pypool.pooling.session_state.statements",
    "pypool.pooling.session_state.streamed",
    "pypool.pooling.session_state.record",
    "pypool.pooling.session_state.replay",
    "pypool.pooling.session_state.reject",
    "pypool.pooling.pool",
    "pypool.pooling.stats",
    "pypool.pooling.prepared",
    "pypool.pooling.prepared.registry",
    "pypool.pooling.prepared.requests",
    "pypool.pooling.prepared.request_queue",
    "pypool.pooling.prepared.cache",
    "pypool.pooling.prepared.sql",
    "pypool.pooling.pipeline_guard",
    "pypool.pooling.prepared.guard_statement",
    "pypool.pooling.prepared.rewriter",
    "pypool.net.flow_control",
    "pypool.net.link_ends",
    "pypool.net.pipeline",
    "pypool.net.outbox",
    "pypool.net.hidden_queries",
    "pypool.net.deferred_writes",
    "pypool.net.records",
    "pypool.net.client",
    "pypool.net.tls_records",
    "pypool.net.server",
    "pypool.pooler.record",
    "pypool.pooler.objects",
    "pypool.pooler.client_logins",
    "pypool.pooler.teardown",
    "pypool.pooler.linking",
    "pypool.pooler.server_logins",
    "pypool.pooler.transactions",
    "pypool.pooler.cancel",
    "pypool.pooler.janitor",
    "pypool.pooler.lifecycle",
)

ROOT = Path(__file__).resolve().parent.parent  # the folder that holds `pypool/`

# What `choose()` decided, for the startup log line.
status = "not decided"


def _location(module: str) -> tuple[Path, str]:
    """The folder and file stem of a hot module (a package is its `__init__`)."""
    base = ROOT.joinpath(*module.split("."))
    return (base, "__init__") if base.is_dir() else (base.parent, base.name)


def source_path(module: str) -> Path:
    """The .py file of a hot module."""
    folder, stem = _location(module)
    return folder / f"{stem}.py"


def extension_path(module: str) -> Path | None:
    """The compiled extension beside a hot module's source, if there is one."""
    folder, stem = _location(module)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = folder / (stem + suffix)
        if candidate.exists():
            return candidate
    return None


def group_library() -> Path | None:
    """The shared library of the compiled group, beside the `pypool` folder."""
    # The newest: an earlier build's library may be left beside it.
    candidates = [candidate for suffix in importlib.machinery.EXTENSION_SUFFIXES
                  for candidate in ROOT.glob(f"*__mypyc{suffix}")]
    return max(candidates, key=lambda path: path.stat().st_mtime, default=None)


def stale_modules() -> list[str]:
    """In a source checkout, hot modules whose source is newer than their extension."""
    if not (ROOT / "pyproject.toml").exists():
        return []  # installed from a wheel: nobody edits these in place
    stale = []
    # A rebuild in place may leave a module's small extension as it was (its C did not
    # change) and put the module's code in the group's new library: the newer one counts.
    group = group_library()
    group_time = group.stat().st_mtime if group is not None else 0.0
    for module in HOT_MODULES:
        extension = extension_path(module)
        if extension is not None and (
            source_path(module).stat().st_mtime > max(extension.stat().st_mtime, group_time)
        ):
            stale.append(module)
    return stale


class SourceFinder(importlib.abc.MetaPathFinder):
    """Imports the hot modules from their .py files even where an extension sits beside."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in HOT_MODULES:
            return None
        source = source_path(fullname)
        package = [str(source.parent)] if source.name == "__init__.py" else None
        return importlib.util.spec_from_file_location(
            fullname, source, submodule_search_locations=package
        )


def choose() -> None:
    """Decide, once per process, whether the hot modules load compiled or as Python."""
    global status
    compiled = [module for module in HOT_MODULES if extension_path(module) is not None]
    reason = ""
    if not compiled:
        status = "pure Python (not compiled at install)"
        return
    if os.environ.get("PYPOOL_PURE") == "1":
        reason = "PYPOOL_PURE=1"
    elif len(compiled) < len(HOT_MODULES) or group_library() is None:
        reason = "only part of the build is there; run `pip install -e .` again"
    else:
        stale = stale_modules()
        if stale:
            reason = f"{', '.join(stale)} edited since compiled; run `pip install -e .` again"
    if not reason:
        status = f"compiled with mypyc ({len(compiled)} modules)"
        return
    status = f"pure Python ({reason})"
    if not any(isinstance(finder, SourceFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, SourceFinder())

