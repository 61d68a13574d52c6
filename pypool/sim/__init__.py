"""A simulator on pypool's own pool: `python -m pypool.sim` (docs/research.md).

engine.py drives the sans-IO Pool and the queue and server policies with a virtual clock;
workload.py makes the arrivals (Poisson, bursts) and service times (fixed, exponential,
heavy-tailed) or replays a transaction log. It prints the report bench/txlog_report.py
prints for a real log, so a real run and its simulation compare line by line.
"""

from .engine import Arrival, SimConfig, Simulation, simulate
from .workload import replay, service_sampler, synthetic

__all__ = ["Arrival", "SimConfig", "Simulation", "replay", "service_sampler", "simulate",
           "synthetic"]
