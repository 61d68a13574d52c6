"""Wait-time and service-time distributions from a pypool transaction log.

    python3 bench/txlog_report.py PATH [--by application_name|user|database|outcome] [--us]

PATH is a `transaction_log` file (one JSON object per line, docs/research.md). Printed:
- wait: every line's wait_us (assigned - arrival; for a wait that never got a server,
  its end - arrival), the queueing delay a client saw;
- service: xact_us of the transactions (released - assigned), how long each held a server;
- response: wait + service of the transactions;
each as count, mean, p50, p95, p99 and max, then the count of each outcome, and the offered
load (arrivals per second over the log's span) with the mean number of servers busy, which
Little's law (L = lambda W) ties to the mean service time. `python -m pypool.sim` prints the
same table for a simulated run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pypool.observe.distribution import summarise, table  # noqa: E402
from pypool.observe.txlog_file import read_lines, report  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--by", choices=["application_name", "user", "database", "outcome"],
                        help="one wait and service line per value of this field as well")
    parser.add_argument("--us", action="store_true", help="microseconds instead of ms")
    args = parser.parse_args()
    lines = read_lines(args.path)
    print(report(lines, "us" if args.us else "ms"))
    if args.by:
        groups: dict[str, list[dict]] = {}
        for line in lines:
            groups.setdefault(str(line.get(args.by)), []).append(line)
        rows = []
        for value, group in sorted(groups.items()):
            rows.append((f"wait {value}"[:23], summarise(r["wait_us"] for r in group)))
            rows.append((f"service {value}"[:23], summarise(
                r["xact_us"] for r in group if r["xact_us"] is not None)))
        print()
        print(table(rows, "us" if args.us else "ms"))


if __name__ == "__main__":
    main()
