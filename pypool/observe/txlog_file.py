"""Reading a transaction log back: its lines, and the report bench/txlog_report.py prints.

The simulator (pypool/sim/) replays the same lines and prints the same report, so the two
can be compared line for line.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .distribution import summarise, table


def read_lines(path: str | Path) -> list[dict[str, Any]]:
    """The log's objects in file order; a line cut short by a crash is skipped."""
    lines = []
    with open(path, encoding="utf-8") as log:
        for text in log:
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                continue
    return lines


def report(lines: Sequence[dict[str, Any]], unit: str = "ms") -> str:
    """Wait, service and response distributions, outcomes, offered load and busy servers."""
    transactions = [r for r in lines if r["kind"] == "transaction"]
    rows = [
        ("wait", summarise(r["wait_us"] for r in lines)),
        ("service", summarise(r["xact_us"] for r in transactions)),
        ("response", summarise(r["wait_us"] + r["xact_us"] for r in transactions)),
    ]
    out = [table(rows, unit)]
    outcomes = Counter(r["outcome"] for r in lines)
    out.append("outcomes: " + ", ".join(f"{name} {count}"
                                        for name, count in sorted(outcomes.items())))
    if lines:
        start = min(r["arrival_us"] for r in lines)
        end = max(r["released_us"] for r in lines)
        span = max(end - start, 1) / 1e6
        busy = sum(r["xact_us"] for r in transactions) / 1e6 / span
        out.append(f"span {span:.3f} s, arrivals {len(lines) / span:.1f}/s, "
                   f"mean servers busy {busy:.2f}")
    return "\n".join(out)
