"""Distributions of times, as the transaction log's reader and the simulator print them.

One summary (count, mean, p50, p95, p99, max) per series of microsecond values, and one way
of printing a few of them side by side, so a real run (bench/txlog_report.py) and its
simulation (python -m pypool.sim) read the same and can be compared line by line.
Percentiles are nearest-rank: the smallest value with at least p% of the values at or below.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    count: int
    mean: float
    p50: float
    p95: float
    p99: float
    max: float


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return float(ordered[rank - 1])


def summarise(values: Iterable[float]) -> Summary:
    ordered = sorted(values)
    if not ordered:
        return Summary(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return Summary(len(ordered), sum(ordered) / len(ordered), percentile(ordered, 50),
                   percentile(ordered, 95), percentile(ordered, 99), float(ordered[-1]))


def table(rows: Sequence[tuple[str, Summary]], unit: str = "ms") -> str:
    """Summaries of microsecond series, one per line, in `unit` (ms or us)."""
    scale = 1000.0 if unit == "ms" else 1.0
    head = f"{'':<24}{'count':>8}" + "".join(
        f"{name:>11}" for name in ("mean", "p50", "p95", "p99", "max"))
    lines = [head + f"   ({unit})"]
    for name, s in rows:
        values = (s.mean, s.p50, s.p95, s.p99, s.max)
        lines.append(f"{name:<24}{s.count:>8}" + "".join(f"{v / scale:>11.3f}" for v in values))
    return "\n".join(lines)
