"""The simulator on its own: against queueing theory, and its policies and timeouts."""

from __future__ import annotations

import math
import random

import pytest

from pypool.observe.distribution import summarise
from pypool.pooling import policies
from pypool.sim import Arrival, SimConfig, replay, service_sampler, simulate, synthetic
from pypool.sim.__main__ import main


def erlang_c_wait(servers: int, rate: float, mean_service: float) -> float:
    """Mean queueing delay of M/M/c (Erlang C), seconds."""
    load = rate * mean_service
    top = load ** servers / math.factorial(servers) * servers / (servers - load)
    bottom = sum(load ** k / math.factorial(k) for k in range(servers)) + top
    return top / bottom / (servers / mean_service - rate)


def mean_wait(lines: list[dict]) -> float:
    return summarise(r["wait_us"] for r in lines).mean / 1e6


def test_mmc_matches_erlang_c() -> None:
    rng = random.Random(7)
    arrivals = synthetic(60000, 160, service_sampler("exponential", 0.02, rng), rng)
    lines = simulate(arrivals, SimConfig(pool_size=4, min_pool_size=4))
    expected = erlang_c_wait(4, 160, 0.02)  # ~14.9 ms
    assert abs(mean_wait(lines) - expected) / expected < 0.1


def test_fixed_service_one_server_is_a_plain_queue() -> None:
    # Three arrivals at once, 10 ms each, one server: waits 0, 10, 20 ms.
    arrivals = [Arrival(0.0, 0.01) for _ in range(3)]
    lines = simulate(arrivals, SimConfig(pool_size=1, min_pool_size=1))
    assert sorted(r["wait_us"] for r in lines) == [0, 10000, 20000]
    # The first is served at once; the third finds the second waiting.
    assert sorted(r["queue_on_arrival"] for r in lines) == [0, 0, 1]


def test_lifo_queue_serves_the_newest_first() -> None:
    arrivals = [Arrival(0.0, 0.01, application_name="first")] + [
        Arrival(0.001 * n, 0.01, application_name=f"w{n}") for n in range(1, 4)]
    config = SimConfig(pool_size=1, min_pool_size=1, queue_policy=policies.LifoQueue())
    lines = simulate(arrivals, config)
    order = [r["application_name"] for r in sorted(lines, key=lambda r: r["assigned_us"])]
    assert order == ["first", "w3", "w2", "w1"]


def test_servers_open_on_demand_within_pool_size() -> None:
    arrivals = [Arrival(0.0, 0.1) for _ in range(5)]
    lines = simulate(arrivals, SimConfig(pool_size=3, connect_time=0.005))
    assert len({r["server_id"] for r in lines}) == 3
    assert sorted(r["wait_us"] for r in lines) == [5000, 5000, 5000, 105000, 105000]


def test_query_wait_timeout() -> None:
    arrivals = [Arrival(0.0, 1.0) for _ in range(3)]
    lines = simulate(arrivals, SimConfig(pool_size=1, min_pool_size=1,
                                         query_wait_timeout=0.5))
    outcomes = sorted(r["outcome"] for r in lines)
    assert outcomes == ["commit", "query_wait_timeout", "query_wait_timeout"]
    assert all(r["wait_us"] == 500000 for r in lines if r["kind"] == "wait")


def test_a_replayed_run_replays_itself() -> None:
    rng = random.Random(3)
    arrivals = synthetic(2000, 150, service_sampler("pareto", 0.02, rng), rng, "burst", 5)
    first = simulate(arrivals, SimConfig(pool_size=4, min_pool_size=4))
    again = simulate(replay(first), SimConfig(pool_size=4, min_pool_size=4))
    assert abs(mean_wait(first) - mean_wait(again)) < 1e-5


def test_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pool-size", "2", "--count", "500", "--rate", "50", "--mean-ms", "20",
                 "--queue-policy", "priority", "--queue-priority", "application_name: a=1",
                 "--apps", "a=0.5,b=0.5", "--service", "lognormal"]) == 0
    out = capsys.readouterr().out
    for word in ("wait", "service", "response", "p95", "p99", "outcomes: commit 500"):
        assert word in out
    with pytest.raises(SystemExit):
        main(["--service", "uniform"])
    assert main(["--queue-policy", "random"]) == 2
