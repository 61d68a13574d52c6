"""Cancel keys are unpredictable: drawn from the OS's CSPRNG, never from `random`.

A key predicted from others (Mersenne Twister outputs can be reconstructed from 624 of them)
lets one client cancel another's queries. The first test reads the source, the second the
keys a real pooler hands out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.integration.rawclient import RawClient

pytestmark = pytest.mark.timeout(30)

PACKAGE = Path(__file__).resolve().parents[2] / "pypool"


def test_no_module_of_the_pooler_uses_random() -> None:
    """Only the embedded test cluster (a port picker) and the simulator (seeded, reproducible
    workloads; it never runs inside the pooler) may import `random`."""
    users = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "embedded.py" or path.relative_to(PACKAGE).parts[0] == "sim":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if "random" in names:
                users.append(str(path.relative_to(PACKAGE)))
    assert users == []
    source = (PACKAGE / "pooler" / "client_logins.py").read_text()
    assert "secrets.randbits(31), secrets.randbits(32)" in source


def test_keys_are_distinct_and_use_their_whole_range(pooler) -> None:
    """200 logins: every BackendKeyData differs, and the secret's top bit is set in some and
    clear in others (a 32-bit secret, as PostgreSQL's)."""
    p = pooler({"auth_type": "trust", "max_client_conn": "300"})
    keys = []
    for _ in range(200):
        with RawClient(p.host, p.port) as raw:
            login = raw.login("app", "app")
            assert login.error is None, login.error
            keys.append(login.backend_key)
    assert len(set(keys)) == 200
    assert {secret >> 31 for _, secret in keys} == {0, 1}
    assert all(0 < pid < 1 << 31 for pid, _ in keys)
