"""Workloads for the simulator: synthetic arrivals and service times, or a log replayed.

Arrivals: `poisson` (exponential gaps at `rate` per second) or `burst` (groups of
`burst_size` arriving at once, the groups Poisson at rate / burst_size: the same mean load,
all at once). Service times (seconds a transaction holds a server): `fixed`, `exponential`,
`pareto` (heavy-tailed, shape `alpha` > 1, scaled to the mean) or `lognormal` (`sigma`, scaled
to the mean). `replay` takes both from a transaction log: each line's arrival (relative to
the first) and its xact_us; a wait that never got a server (it timed out or left) is given
the mean service time of the log's transactions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from .engine import Arrival

SERVICE_KINDS = ("fixed", "exponential", "pareto", "lognormal")
ARRIVAL_KINDS = ("poisson", "burst")


def service_sampler(kind: str, mean: float, rng: random.Random, alpha: float = 1.5,
                    sigma: float = 1.0) -> Callable[[], float]:
    """A function drawing service times (seconds) with the given mean."""
    if kind == "fixed":
        return lambda: mean
    if kind == "exponential":
        return lambda: rng.expovariate(1 / mean)
    if kind == "pareto":
        if alpha <= 1:
            raise ValueError("pareto needs alpha > 1 for a finite mean")
        scale = mean * (alpha - 1) / alpha  # x_m: Pareto's mean is alpha x_m / (alpha - 1)
        return lambda: scale * rng.paretovariate(alpha)
    if kind == "lognormal":
        mu = math.log(mean) - sigma * sigma / 2
        return lambda: rng.lognormvariate(mu, sigma)
    raise ValueError(f"service times: one of {', '.join(SERVICE_KINDS)}, not {kind!r}")


def synthetic(count: int, rate: float, service: Callable[[], float], rng: random.Random,
              kind: str = "poisson", burst_size: int = 10,
              users: Sequence[str] = ("app",), apps: Sequence[tuple[str, float]] = ()
              ) -> list[Arrival]:
    """`count` arrivals at `rate` per second on average."""
    if kind not in ARRIVAL_KINDS:
        raise ValueError(f"arrivals: one of {', '.join(ARRIVAL_KINDS)}, not {kind!r}")
    group = burst_size if kind == "burst" else 1
    names = [name for name, _ in apps]
    shares = [share for _, share in apps]
    arrivals: list[Arrival] = []
    at = 0.0
    while len(arrivals) < count:
        at += rng.expovariate(rate / group)
        for _ in range(min(group, count - len(arrivals))):
            app = rng.choices(names, shares)[0] if names else ""
            arrivals.append(Arrival(at, service(), rng.choice(list(users)), app))
    return arrivals


def replay(lines: Sequence[dict[str, Any]]) -> list[Arrival]:
    """A transaction log's lines as arrivals with their own service times."""
    if not lines:
        return []
    start = min(line["arrival_us"] for line in lines)
    served = [line["xact_us"] for line in lines if line.get("xact_us") is not None]
    mean = sum(served) / len(served) if served else 0
    # In arrival order; arrivals in the same microsecond in the order they were served.
    ordered = sorted(lines, key=lambda line: (line["arrival_us"],
                                              line.get("assigned_us") or line["released_us"]))
    return [
        Arrival((line["arrival_us"] - start) / 1e6,
                (line["xact_us"] if line.get("xact_us") is not None else mean) / 1e6,
                line.get("user") or "app", line.get("application_name") or "")
        for line in ordered
    ]
