"""How many objects one transaction touches: pypool's path and the pooling floor's, counted.

    python3 bench/objects_per_tx.py [--mode simple|extended] [--transactions N] [--set K=V]
                                    [--types] [--where TYPE]

In a real run each of the pooler's reads finds its code and objects pushed out of the caches,
and an object of a connection that a transaction reads or writes costs 50-90 ns beyond its
instructions (bench/README.md, "At a fixed rate"). Timing cannot resolve a change of a few
such objects on this machine; counting them can, exactly and without noise. This runs
bench/path_cpu.py's steady state (50 clients on 20 servers, 30 waiting, pgbench -S's
transaction, every release handing the server on) with pypool as Python (PYPOOL_PURE=1, set
here), every pypool class's attribute reads and writes recorded, and prints how many distinct
objects each transaction touches:
- pypool's own objects (a client, its link, a reader, a pool, ...) and the containers (dict,
  list, deque, set, bytearray) read from their attributes: an attribute read and then used
  is one more object fetched;
- split into a connection's own (reachable from one client or server and not from the pool
  or the pooler: fetched cold in a real run, as each connection comes round once in dozens
  of transactions), shared (the pool's, the pooler's: touched by every transaction, so
  warmer), and made during the run (requests queued, a session record);
- beside the same count for bench/pool_floor.py's pooling over the same fakes.

Strings, bytes, numbers, frozensets and enum members are not counted, nor the transports
(both poolers have them). `--types` lists the objects by type and attribute; `--where TYPE`
the code lines that touch objects of that type (a name as `--types` prints it), per
transaction: where to look for the next one to take off the path. `--set` overrides a
[pgbouncer] key, as in path_cpu.py (`--set max_prepared_statements=0`).
"""

from __future__ import annotations

import argparse
import collections
import enum
import os
import sys
from collections.abc import Iterator
from typing import Any

os.environ["PYPOOL_PURE"] = "1"  # attribute reads of compiled classes cannot be recorded

import path_cpu  # noqa: E402  (bench/path_cpu.py: the steady state, the fakes)
import pool_floor  # noqa: E402

from pypool import compiled  # noqa: E402

CONTAINERS = (dict, list, set, frozenset, collections.deque, bytearray)
# Counted when read from an attribute: by exact type (`isinstance` would ask a hooked object
# for its __class__ and count it as touched). Not frozensets: pypool's are constants or keys
# compared by identity.
COUNTED = {dict, list, set, collections.deque, bytearray, collections.OrderedDict}
LEAVES = (str, bytes, int, float, bool, type(None), enum.Enum, type, type(sys))

# While a transaction runs: the objects it touched, by id (kept, so no id is reused), and
# for each, what it is ("ClientConnection", "ReplyReader.out", ...).
touched: dict[int, tuple[object, str]] = {}
recording = False
# With --where: for each object's name, the code lines that touched it, and the attribute.
where: collections.Counter[tuple[str, str]] = collections.Counter()
WHERE = False


def _note(name: str, attr: str) -> None:
    frame = sys._getframe(2)
    code = frame.f_code
    where[(name, f"{os.path.basename(code.co_filename)}:{frame.f_lineno} "
                 f"{code.co_name} .{attr}")] += 1


def hook(cls: type) -> None:
    """Record every attribute read and write on instances of `cls`."""
    get, put = cls.__getattribute__, cls.__setattr__
    if getattr(get, "counting", False):
        return
    name = cls.__name__

    def __getattribute__(self: Any, attr: str) -> Any:
        value = get(self, attr)
        if recording and attr != "__class__":
            if WHERE:
                _note(type(self).__name__, attr)
            touched[id(self)] = (self, type(self).__name__)
            if type(value) in COUNTED:
                if WHERE:
                    _note(f"{type(self).__name__}.{attr}", attr)
                touched[id(value)] = (value, f"{type(self).__name__}.{attr}")
        return value

    def __setattr__(self: Any, attr: str, value: Any) -> None:
        if recording:
            if WHERE:
                _note(type(self).__name__, attr + " =")
            touched[id(self)] = (self, type(self).__name__)
        put(self, attr, value)

    __getattribute__.counting = True  # type: ignore[attr-defined]
    __getattribute__.__qualname__ = f"{name}.__getattribute__"
    cls.__getattribute__ = __getattribute__  # type: ignore[method-assign]
    cls.__setattr__ = __setattr__  # type: ignore[method-assign]


def classes(prefix: str) -> Iterator[type]:
    """The classes defined in the loaded modules whose names start with `prefix`."""
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith(prefix):
            continue
        for value in vars(module).values():
            if (isinstance(value, type) and value.__module__ == module.__name__
                    and not issubclass(value, (enum.Enum, BaseException))
                    and value.__module__.startswith(prefix)):
                yield value


def module_objects(prefix: str) -> list[object]:
    """The containers and instances the modules whose names start with `prefix` hold at
    their top level (state tables, constants): shared by every connection."""
    found: list[object] = []
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith(prefix):
            found.extend(value for value in vars(module).values()
                         if not isinstance(value, LEAVES) and not callable(value))
    return found


def reachable(roots: list[object], stop: set[int], depth: int = 8) -> set[int]:
    """The ids of the objects reachable from `roots` through attributes and container
    items, not entering the objects in `stop` nor leaves."""
    seen: set[int] = set()
    todo = [(root, 0) for root in roots]
    while todo:
        obj, level = todo.pop()
        if id(obj) in seen or id(obj) in stop or isinstance(obj, LEAVES) or level > depth:
            continue
        if callable(obj) and not isinstance(obj, CONTAINERS) and not hasattr(obj, "__dict__"):
            continue
        seen.add(id(obj))
        for child in _children(obj):
            todo.append((child, level + 1))
    return seen


def _children(obj: object) -> list[object]:
    if isinstance(obj, dict):
        return [*obj.keys(), *obj.values()]
    if isinstance(obj, CONTAINERS):
        return list(obj)  # type: ignore[call-overload]
    if isinstance(obj, tuple):
        return list(obj)
    found = []
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            try:
                found.append(object.__getattribute__(obj, slot))
            except AttributeError:
                pass
    found.extend(getattr(obj, "__dict__", {}).values())
    return found


def count(servers: list[Any], request: bytes, reply: bytes, connections: set[int],
          shared: set[int], transactions: int) -> tuple[dict[str, float], collections.Counter]:
    """Mean distinct objects a transaction touches, by kind, and by name over all."""
    global recording
    kinds: collections.Counter[str] = collections.Counter()
    names: collections.Counter[str] = collections.Counter()

    def tally() -> None:  # after each transaction
        for key, (_, name) in touched.items():
            kind = ("connection" if key in connections else
                    "shared" if key in shared else "made in the run")
            kinds[kind] += 1
            names[f"{kind}: {name}"] += 1
        touched.clear()

    run = path_cpu._serving(servers, request, reply, after=tally)
    touched.clear()
    recording = True
    try:
        run(transactions)
    finally:
        recording = False
    means = {kind: n / transactions for kind, n in kinds.items()}
    means["all"] = sum(kinds.values()) / transactions
    return means, names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="simple", choices=["simple", "extended"])
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--types", action="store_true", help="list the objects by type")
    parser.add_argument("--where", metavar="TYPE",
                        help="the code lines that touch objects of TYPE (a name as --types "
                             "prints it, ClientStatements or Pool.login), per transaction")
    args = parser.parse_args()
    global WHERE
    WHERE = bool(args.where)
    keys: dict[str, Any] = {}
    for item in args.set:
        key, _, value = item.partition("=")
        keys[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    request, reply = path_cpu.requests(args.mode), path_cpu.replies(args.mode)
    print(f"pypool {compiled.status}; -M {args.mode}, {path_cpu.CLIENTS} clients on "
          f"{path_cpu.POOL_SIZE} servers, {args.transactions} transactions"
          + (f"; {keys}" if keys else ""))

    fake, servers = path_cpu.pooler_serving(args.mode, keys)
    try:
        path_cpu._serving(servers, request, reply)(1000)  # the steady state, warmed up
        for cls in classes("pypool."):
            hook(cls)
        pooler = fake.pooler
        conns = [*fake.pool().clients, *servers]
        shared = reachable([pooler, fake.pool(), *module_objects("pypool.")],
                           {id(c) for c in conns})
        connections = set()
        for conn in conns:
            connections |= reachable([conn], shared | {id(c) for c in conns if c is not conn})
        pypool, pypool_names = count(servers, request, reply, connections, shared,
                                     args.transactions)
    finally:
        fake.close()
    pypool_where = dict(where)

    for cls in (pool_floor.Pool, pool_floor.Server, pool_floor.Client):
        hook(cls)
    floor_servers = path_cpu.floor_serving(args.mode)
    pool = floor_servers[0].pool
    floor_conns = [*floor_servers, *{id(c): c for c in pool.waiting}.values(),
                   *(s.client for s in floor_servers if s.client is not None)]
    shared = reachable([pool], {id(c) for c in floor_conns})
    connections = set()
    for conn in floor_conns:
        connections |= reachable([conn], shared | {id(c) for c in floor_conns
                                                   if c is not conn})
    floor, floor_names = count(floor_servers, request, reply, connections, shared,
                               args.transactions)

    print("objects touched per transaction (means):")
    print(f"  {'':20s} {'all':>6s} {'connection':>11s} {'shared':>7s} {'made':>5s}")
    for label, means in (("pypool", pypool), ("pooling floor", floor)):
        print(f"  {label:20s} {means['all']:6.1f} {means.get('connection', 0):11.1f} "
              f"{means.get('shared', 0):7.1f} {means.get('made in the run', 0):5.1f}")
    if args.where:
        print(f"\npypool, lines touching {args.where}, per transaction:")
        for (name, line), n in sorted(pypool_where.items(), key=lambda item: item[0][1]):
            if name == args.where:
                print(f"  {n / args.transactions:5.2f}  {line}")
    if args.types:
        for label, names, n in (("pypool", pypool_names, args.transactions),
                                ("pooling floor", floor_names, args.transactions)):
            print(f"\n{label}, per transaction:")
            for name, total in sorted(names.items()):
                print(f"  {total / n:5.2f}  {name}")


if __name__ == "__main__":
    main()
