"""node-postgres for the tests that drive it: npm installs it once per session."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def node_pg(tmp_path_factory) -> Path:
    """A folder with node-postgres installed by npm, or a skip saying why not."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    folder = tmp_path_factory.mktemp("node-pg")
    try:
        result = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent", "pg"],
                                cwd=folder, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("npm install pg timed out (no registry access?)")
    if result.returncode != 0:
        pytest.skip(f"npm install pg failed: {result.stderr.strip()[-300:]}")
    return folder
