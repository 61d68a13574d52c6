"""Statistics over time: PgBouncer's per-period averages, the stats log line, latency histograms.

`PoolStats` (pool.py) holds plain integer counters that only grow. This module reads them and
never writes them:

- `StatsPeriods` keeps, per pool, the counters as they were at the last two ticks of the
  stats_period timer, and computes the `avg_*` columns of SHOW STATS exactly as PgBouncer's
  stats.c does: rates (per second) for counts and bytes, and per-query, per-transaction and
  per-assignment means for the times, over the span from the older tick to now.
- `Histogram` is a fixed set of bucket bounds with an integer count per bucket: one short scan and
  one increment per observation, summed into Prometheus' cumulative form only at scrape time.

Sans-IO: no asyncio, no sockets; the pooler's timer calls `refresh`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

# PgBouncer's counters in SHOW STATS order; the names are PoolStats fields.
COUNTERS = (
    "server_assignment_count",
    "xact_count",
    "query_count",
    "bytes_received",
    "bytes_sent",
    "xact_time_us",
    "query_time_us",
    "wait_time_us",
    "client_parse_count",
    "server_parse_count",
    "bind_count",
    "client_login_count",
)
Totals = tuple[int, ...]  # one value per COUNTERS entry
ZERO: Totals = (0,) * len(COUNTERS)

_ASSIGNMENTS, _XACTS, _QUERIES = 0, 1, 2
_XACT_TIME, _QUERY_TIME, _WAIT_TIME = 5, 6, 7
# Averaged as "per second"; the three times are averaged per event instead. Derived, so a
# counter added to COUNTERS is averaged without a second edit here.
_RATES = tuple(i for i in range(len(COUNTERS)) if i not in (_XACT_TIME, _QUERY_TIME, _WAIT_TIME))


def totals(stats: Any) -> Totals:
    """The counters of one PoolStats, in COUNTERS order."""
    return tuple(getattr(stats, name) for name in COUNTERS)


def add(many: Iterable[Totals]) -> Totals:
    """Element-wise sum, for a database's pools or the whole pooler."""
    result = list(ZERO)
    for row in many:
        for i, value in enumerate(row):
            result[i] += value
    return tuple(result)


def averages(current: Totals, older: Totals, seconds: float) -> Totals:
    """PgBouncer's calc_average: rates per second, and mean times in microseconds."""
    if seconds <= 0:
        return ZERO
    delta = [max(0, c - o) for c, o in zip(current, older, strict=True)]
    avg = [0] * len(COUNTERS)
    for i in _RATES:
        avg[i] = int(delta[i] / seconds)
    for time_index, count_index in (
        (_QUERY_TIME, _QUERIES), (_XACT_TIME, _XACTS), (_WAIT_TIME, _ASSIGNMENTS),
    ):
        if delta[count_index] > 0:
            avg[time_index] = delta[time_index] // delta[count_index]
    return tuple(avg)


class StatsPeriods:
    """Snapshots of every pool's counters at the last two stats_period ticks.

    Averages run from the older tick to now, so they cover between one and two periods, as in
    PgBouncer. Pools are keyed by identity: a pool created after a tick averages from zero.
    """

    def __init__(self, now: float) -> None:
        self.new_stamp = now
        self.old_stamp = now - 1.0
        self._newer: dict[Any, Totals] = {}
        self._older: dict[Any, Totals] = {}

    def refresh(self, pools: Iterable[Any], now: float) -> Totals:
        """A stats_period tick; returns the whole pooler's averages over the period just ended
        (the numbers of the "stats:" log line)."""
        self.old_stamp, self.new_stamp = self.new_stamp, now
        newer: dict[Any, Totals] = {}
        older: dict[Any, Totals] = {}
        for pool in pools:
            older[pool] = self._newer.get(pool, ZERO)
            newer[pool] = totals(pool.stats)
        self._newer, self._older = newer, older
        return averages(add(newer.values()), add(older.values()), now - self.old_stamp)

    def older(self, pool: Any) -> Totals:
        return self._older.get(pool, ZERO)

    def averages_of(self, pools: Sequence[Any], now: float) -> Totals:
        """The avg_* values for a group of pools (one database, or all of them)."""
        current = add(totals(pool.stats) for pool in pools)
        return averages(current, add(self.older(pool) for pool in pools), now - self.old_stamp)


def stats_line(avg: Totals) -> str:
    """PgBouncer's periodic log line (1.26's, with client logins/s), word for word, so
    existing greps keep working."""
    return (
        f"stats: {avg[1]} xacts/s, {avg[2]} queries/s, {avg[8]} client parses/s, "
        f"{avg[9]} server parses/s, {avg[10]} binds/s, {avg[11]} client logins/s, "
        f"in {avg[3]} B/s, out {avg[4]} B/s, xact {avg[5]} us, query {avg[6]} us, "
        f"wait {avg[7]} us"
    )


# Bucket upper bounds in seconds. Queue waits are usually zero or tiny and turn into seconds
# when the pool is exhausted; transactions span microseconds to minutes.
# Typed as tuples of any length: compiled, a tuple of a fixed length of floats is a C struct,
# which each call of `observe` would box into a new tuple of 14 or 16 new floats
# (bench/path_cpu.py measured 400 ns a transaction).
WAIT_BUCKETS: Final[tuple[float, ...]] = (
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0)
XACT_BUCKETS: Final[tuple[float, ...]] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0)


# A histogram is its bounds (one of the tuples above) and a list of counts in PoolStats:
# `counts[i]` holds values in (bounds[i-1], bounds[i]], the last slot is +Inf. Its sum, which
# Prometheus wants, is not kept: PoolStats adds the same times up in microseconds
# (xact_time_us, wait_time_us). Two plain lists in the pool's counters, not two objects
# holding them: every transaction counts in both (bench/README.md, "Shared objects").


def buckets(bounds: tuple[float, ...]) -> list[int]:
    """Empty counts for a histogram over `bounds`."""
    return [0] * (len(bounds) + 1)


def observe(bounds: tuple[float, ...], counts: list[int], seconds: float) -> None:
    """Count `seconds` in its bucket. bisect_left's slot, found by a loop compiled code runs
    without a call: the first bound at or above `seconds` (most observations fall in the
    first few buckets)."""
    slot = 0
    for bound in bounds:
        if seconds <= bound:
            break
        slot += 1
    counts[slot] += 1


def cumulative(bounds: tuple[float, ...], counts: list[int],
               extra_zeros: int = 0) -> list[tuple[str, int]]:
    """Prometheus buckets: (upper bound, observations <= it), ending with "+Inf".

    `extra_zeros` adds that many observations of 0 (they fall in every bucket): the queue
    wait histogram is only fed when a client actually waited, and the scrape adds the
    assignments that did not wait.
    """
    found = []
    running = extra_zeros
    for bound, count in zip(bounds, counts, strict=False):
        running += count
        found.append((repr(bound), running))
    found.append(("+Inf", running + counts[-1]))
    return found
