"""The experiments that compare pypool with PgBouncer (bench/experiments/clients_200_on_20,
busy_machine) keep their committed result.md in step with their committed data.json:
`--report-only` writes them again from the data, without measuring, and must give the same
text (and a chart, when matplotlib is installed).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

EXPERIMENTS = REPO_ROOT / "bench" / "experiments"

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("name", ["clients_200_on_20", "busy_machine"])
def test_the_committed_result_is_its_data_s(name: str, tmp_path: Path) -> None:
    shutil.copy(EXPERIMENTS / name / "data.json", tmp_path / "data.json")
    done = subprocess.run([sys.executable, str(EXPERIMENTS / name / "run.py"), "--report-only",
                           "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=100, check=False)
    assert done.returncode == 0, done.stderr
    committed = (EXPERIMENTS / name / "result.md").read_text(encoding="utf-8")
    assert (tmp_path / "result.md").read_text(encoding="utf-8") == committed
    assert "| pypool |" in committed and "| PgBouncer |" in committed
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "chart.png").stat().st_size > 10_000
