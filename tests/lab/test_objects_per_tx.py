"""bench/objects_per_tx.py still runs, and README.md states what it counts: the objects one
transaction touches on pypool's common path, and on the pooling floor's. The count is exact
(the script records attribute reads over fake sockets, pure Python), so it is checked as a
figure, not a timing: a change that adds an object to every transaction, or takes one off,
updates README.md's sentence with it.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.timeout(60)

# README.md: "... `bench/objects_per_tx.py` counts them exactly: 29 a transaction now (...),
# the pooling floor 8 (...)."
STATED = re.compile(r"objects_per_tx\.py` counts them exactly: (\d+) a\s+transaction now"
                    r".*?the\s+pooling\s+floor\s+(\d+)\b", re.S)


def counted(mode: str) -> dict[str, float]:
    """The script's "all" column for pypool and for the floor."""
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "objects_per_tx.py"), "--mode", mode,
         "--transactions", "300"],
        capture_output=True, text=True, timeout=50, check=False)
    assert done.returncode == 0, done.stderr
    rows = dict(re.findall(r"^  (pypool|pooling floor) +([\d.]+) ", done.stdout, re.M))
    assert set(rows) == {"pypool", "pooling floor"}, done.stdout
    return {name: float(value) for name, value in rows.items()}


@pytest.mark.parametrize("mode", ["simple", "extended"])
def test_readme_states_the_objects_a_transaction_touches(mode: str) -> None:
    stated = STATED.search((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    assert stated is not None, "README.md no longer states the count"
    pypool, floor = (float(n) for n in stated.groups())
    assert counted(mode) == {"pypool": pypool, "pooling floor": floor}
