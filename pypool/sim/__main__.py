"""python -m pypool.sim: simulate a pool and print wait and service distributions.

    python -m pypool.sim --pool-size 4 --rate 150 --service exponential --mean-ms 20
    python -m pypool.sim --pool-size 4 --replay tx.jsonl       # a real run's own load
    python -m pypool.sim --queue-policy lifo --arrivals burst --burst-size 50 ...

The pool, the queue policy and the server policy are pypool's own (pooling/); the same
names as the ini's queue_policy / server_policy, or module:Class.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from ..observe.txlog_file import read_lines, report
from ..pooling import policies
from .engine import SimConfig, simulate
from .workload import ARRIVAL_KINDS, SERVICE_KINDS, replay, service_sampler, synthetic


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pypool.sim",
                                     description=__doc__.split("\n\n")[0])
    pool = parser.add_argument_group("the pool (as the ini keys)")
    pool.add_argument("--pool-size", type=int, default=20)
    pool.add_argument("--min-pool-size", type=int, default=0,
                      help="servers logged in before the first arrival")
    pool.add_argument("--reserve-pool-size", type=int, default=0)
    pool.add_argument("--reserve-pool-timeout", type=float, default=5.0, help="seconds")
    pool.add_argument("--connect-ms", type=float, default=5.0,
                      help="how long a new server takes to log in")
    pool.add_argument("--query-wait-timeout", type=float, default=0.0, help="seconds; 0: off")
    pool.add_argument("--queue-policy", default="fifo")
    pool.add_argument("--queue-priority", default="")
    pool.add_argument("--server-policy", default="lifo")
    load = parser.add_argument_group("the load")
    load.add_argument("--replay", metavar="LOG",
                      help="arrivals and service times from a transaction log")
    load.add_argument("--arrivals", choices=ARRIVAL_KINDS, default="poisson")
    load.add_argument("--rate", type=float, default=100.0, help="arrivals per second")
    load.add_argument("--count", type=int, default=10000, help="transactions")
    load.add_argument("--burst-size", type=int, default=10)
    load.add_argument("--service", choices=SERVICE_KINDS, default="exponential")
    load.add_argument("--mean-ms", type=float, default=10.0, help="mean service time")
    load.add_argument("--alpha", type=float, default=1.5, help="pareto shape")
    load.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma")
    load.add_argument("--users", type=int, default=1, help="users u1..uN, drawn at random")
    load.add_argument("--apps", default="",
                      help="application_name shares, e.g. web=0.8,batch=0.2")
    load.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write", metavar="PATH", help="the simulated lines, as a log")
    parser.add_argument("--us", action="store_true", help="microseconds instead of ms")
    return parser.parse_args(argv)


def config_from(args: argparse.Namespace) -> SimConfig:
    make_queue = policies.queue_factory(args.queue_policy, args.queue_priority)
    make_server = policies.server_factory(args.server_policy)
    return SimConfig(
        pool_size=args.pool_size, min_pool_size=args.min_pool_size,
        reserve_pool_size=args.reserve_pool_size,
        reserve_pool_timeout=args.reserve_pool_timeout, connect_time=args.connect_ms / 1000,
        query_wait_timeout=args.query_wait_timeout,
        queue_policy=None if make_queue is None else make_queue(),
        server_policy=None if make_server is None else make_server(),
        queue_policy_name=args.queue_policy, server_policy_name=args.server_policy,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = config_from(args)
        if args.replay:
            arrivals = replay(read_lines(args.replay))
            what = f"replay of {args.replay}"
        else:
            rng = random.Random(args.seed)
            service = service_sampler(args.service, args.mean_ms / 1000, rng, args.alpha,
                                      args.sigma)
            apps = []
            for item in filter(None, args.apps.split(",")):
                name, _, share = item.partition("=")
                apps.append((name.strip(), float(share or 1)))
            users = [f"u{n}" for n in range(1, args.users + 1)]
            arrivals = synthetic(args.count, args.rate, service, rng, args.arrivals,
                                 args.burst_size, users, apps)
            what = (f"{args.arrivals} arrivals at {args.rate:g}/s, {args.service} service "
                    f"mean {args.mean_ms:g} ms, {args.count} transactions, seed {args.seed}")
    except (ValueError, OSError) as exc:
        print(f"python -m pypool.sim: {exc}", file=sys.stderr)
        return 2
    lines = simulate(arrivals, config)
    if args.write:
        with open(args.write, "w", encoding="utf-8") as out:
            out.writelines(json.dumps(line) + "\n" for line in lines)
    print(f"simulated: {what}; pool_size {config.pool_size}, queue_policy "
          f"{args.queue_policy}, server_policy {args.server_policy}")
    print(report(lines, "us" if args.us else "ms"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
