"""pooling/stats.py, sans-IO: the averages SHOW STATS and the stats log line are made of
(PgBouncer's calc_average), the stats_period snapshots, the histograms' Prometheus form."""

from __future__ import annotations

from pypool.pooling.pool import Pool, PoolLimits
from pypool.pooling.stats import (
    COUNTERS,
    ZERO,
    StatsPeriods,
    averages,
    buckets,
    cumulative,
    observe,
    stats_line,
    totals,
)


def _pool(name: str = "app") -> Pool:
    return Pool(name, "app", PoolLimits(5, 0, 0, 5.0, "transaction"))


def _counters(**values: int) -> tuple[int, ...]:
    return tuple(values.get(name, 0) for name in COUNTERS)


def test_averages_are_rates_and_per_event_means() -> None:
    older = _counters(xact_count=100, query_count=300, server_assignment_count=100,
                      bytes_received=1_000, bytes_sent=9_000, xact_time_us=50_000,
                      query_time_us=30_000, wait_time_us=0, bind_count=10)
    current = _counters(xact_count=300, query_count=700, server_assignment_count=300,
                        bytes_received=5_000, bytes_sent=29_000, xact_time_us=250_000,
                        query_time_us=110_000, wait_time_us=40_000, bind_count=30)
    avg = dict(zip(COUNTERS, averages(current, older, 2.0), strict=True))
    assert avg["xact_count"] == 100  # (300 - 100) / 2 s
    assert avg["query_count"] == 200
    assert avg["server_assignment_count"] == 100
    assert avg["bytes_received"] == 2_000 and avg["bytes_sent"] == 10_000
    assert avg["bind_count"] == 10
    assert avg["xact_time_us"] == 1_000  # 200_000 us over 200 transactions
    assert avg["query_time_us"] == 200  # 80_000 us over 400 queries
    assert avg["wait_time_us"] == 200  # 40_000 us over 200 assignments
    assert averages(current, older, 0) == ZERO
    assert averages(older, older, 5.0) == ZERO  # nothing happened: no division by zero


def test_periods_average_from_the_older_tick_to_now() -> None:
    pool = _pool()
    periods = StatsPeriods(now=100.0)
    pool.stats.xact_count = 10
    periods.refresh([pool], now=110.0)  # newer = 10 at t=110, older = 0 at t=100
    pool.stats.xact_count = 30
    line = periods.refresh([pool], now=120.0)  # older = 10 at t=110
    assert line[1] == 2  # the period just ended: (30 - 10) / 10 s
    pool.stats.xact_count = 45
    avg = periods.averages_of([pool], now=125.0)  # from t=110 to now: (45 - 10) / 15 s
    assert avg[1] == 2
    newcomer = _pool("bench")
    newcomer.stats.xact_count = 30
    assert periods.averages_of([newcomer], now=125.0)[1] == 2  # from zero, over 15 s
    assert totals(pool.stats)[1] == 45


def test_stats_line_is_pgbouncers() -> None:
    avg = _counters(xact_count=5, query_count=7, bytes_received=100, bytes_sent=200,
                    xact_time_us=300, query_time_us=40, wait_time_us=1)
    assert stats_line(avg) == (
        "stats: 5 xacts/s, 7 queries/s, 0 client parses/s, 0 server parses/s, 0 binds/s, "
        "0 client logins/s, in 100 B/s, out 200 B/s, xact 300 us, query 40 us, wait 1 us"
    )


def test_histogram_buckets_are_cumulative_with_le_semantics() -> None:
    bounds = (0.001, 0.01, 0.1)
    counts = buckets(bounds)
    for seconds in (0.0005, 0.001, 0.002, 0.05, 0.05, 3.0):
        observe(bounds, counts, seconds)
    assert counts == [2, 1, 2, 1]  # 0.001 falls in "le 0.001"
    assert cumulative(bounds, counts) == [("0.001", 2), ("0.01", 3), ("0.1", 5), ("+Inf", 6)]
    assert cumulative(bounds, counts, extra_zeros=4) == [
        ("0.001", 6), ("0.01", 7), ("0.1", 9), ("+Inf", 10)]
