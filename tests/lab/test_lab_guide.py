"""Every command of the lab guide (docs/lab/README.md), run as a student would run it, and
what the guide says they should see (its `<!-- expect: REGEX -->` lines after each block).

Each exercise (a `## ` section) is a test of its own: its commands run in order, in one
scratch folder that holds a `bench` link to this checkout's bench/ (so `python3 bench/...`
works there as at the root) and with this checkout on PYTHONPATH; files the exercise writes
(lab_policy.py, the logs) land in the scratch folder.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

GUIDE = REPO_ROOT / "docs" / "lab" / "README.md"
SECTION = re.compile(r"^## (.*)$", re.MULTILINE)
BLOCK = re.compile(r"```sh\n(.*?)```\n((?:<!-- expect: [^\n]* -->\n)*)", re.DOTALL)

pytestmark = pytest.mark.timeout(240)


def sections() -> dict[str, str]:
    """Each exercise's title and text."""
    parts = SECTION.split(GUIDE.read_text(encoding="utf-8"))
    return {title: body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def blocks(text: str | None = None) -> list[tuple[str, list[str]]]:
    """The commands of the guide (or of one exercise) and what each should print."""
    if text is None:
        text = GUIDE.read_text(encoding="utf-8")
    found = []
    for match in BLOCK.finditer(text):
        expects = re.findall(r"<!-- expect: ([^\n]*) -->", match.group(2))
        found.append((match.group(1), expects))
    return found


def test_the_guide_has_its_commands() -> None:
    found = blocks()
    assert len(found) >= 9
    assert sum(len(expects) for _, expects in found) >= 30
    assert all(blocks(text) for text in sections().values())  # every exercise has commands


@pytest.mark.parametrize("title", list(sections()))
def test_every_command_of_the_lab_guide(title: str, tmp_path: Path) -> None:
    (tmp_path / "bench").symlink_to(REPO_ROOT / "bench")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for script, expects in blocks(sections()[title]):
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=200,
                              check=False)
        assert done.returncode == 0, (
            f"{script}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
        for expect in expects:
            assert re.search(expect, done.stdout), (
                f"{script}\nexpected {expect!r} in:\n{done.stdout}")
