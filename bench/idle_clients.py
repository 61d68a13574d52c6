"""Open COUNT client connections, run ``SELECT 1`` on each, then hold them idle.

The password comes from the PGPASSWORD environment variable, as for libpq.

Run by bench.py as a child process (several in parallel for 10,000 connections, so that
no single process needs more file descriptors or CPU than it can get). Protocol with the
parent: once every login has finished or failed, print one JSON line
``{"ok": N, "failed": M, "seconds": S, "error": "..."}`` to stdout, then keep the
connections open until stdin is closed, then close them and exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time

import pgwire


async def _open_one(args: argparse.Namespace, gate: asyncio.Semaphore):
    async with gate:
        connection = await pgwire.connect(
            args.host, args.port, args.user, os.environ["PGPASSWORD"], args.dbname
        )
        await connection.query("SELECT 1")
        return connection


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--dbname", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument(
        "--concurrency", type=int, default=50, help="logins in flight at once (listen backlog)"
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds for all logins")
    args = parser.parse_args()

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    gate = asyncio.Semaphore(args.concurrency)
    started = time.monotonic()
    tasks = [asyncio.ensure_future(_open_one(args, gate)) for _ in range(args.count)]
    done, pending = await asyncio.wait(tasks, timeout=args.timeout)
    for task in pending:
        task.cancel()
    connections, errors = [], []
    for task in done:
        if task.exception() is None:
            connections.append(task.result())
        else:
            errors.append(repr(task.exception()))
    if pending:
        errors.append(f"{len(pending)} logins still pending after {args.timeout:.0f} s")
    report = {
        "ok": len(connections),
        "failed": args.count - len(connections),
        "seconds": round(time.monotonic() - started, 3),
        "error": errors[0] if errors else "",
    }
    print(json.dumps(report), flush=True)

    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await asyncio.gather(*(connection.close() for connection in connections))


if __name__ == "__main__":
    asyncio.run(main())
