"""Generic calls per transaction: where compiled code still goes through CPython by name.

    python3 bench/generic_calls.py [TREE] [--mode simple|extended] [--transactions N]
                                   [--callers FUNCTION]

mypyc compiles a field read of a native class to a load and a call of a native function to
a C call; what it cannot type it hands to CPython: an attribute of a plain Python object or
of a value typed Any (`PyObject_GetAttr`), a method of a deque or a transport
(`_PyObject_GetMethod`), a truth test of an object (`PyObject_IsTrue`), a call of a Python
callable (`PyObject_Vectorcall`: a bound method kept in a field is one, without the
lookup), an allocation (`_PyObject_Malloc`). Each is a few tens of nanoseconds, too little
for a timer to resolve one by one and too many to see in a profile, which spreads them over
libpython. This counts them exactly: uprobes (`perf probe`) on those
functions of the running libpython, `perf stat` over bench/path_cpu.py's steady state (50
clients on 20 servers, pgbench -S's transaction, every release handing the server on), run
with no transactions and with N, the difference divided by N. The harness's own Python (its
loop over the fakes) is in the count too, the same for every tree: compare trees, or use
`--callers` to see which calls are pypool's (`perf record` with call stacks on one function;
its two innermost pypool frames per call site, under a Protocol's data_received).

Needs root (or perf_event_paranoid -1) and perf; the probes are left in place for the next
run (`perf probe -d 'probe_libpython*:*'` removes them). bench/README.md, "Looked up by
name", says what it found.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
WARM = 2000  # transactions run before the counted ones (in both children)
FUNCTIONS = ("_PyObject_GetMethod", "PyObject_GetAttr", "PyObject_IsTrue",
             "PyObject_Vectorcall", "_PyObject_Malloc")

# The child: path_cpu.py's steady state for TREE, warmed, then `count` transactions.
DRIVER = """
import os, sys
os.environ["PATH_CPU_TREE"] = {tree!r}
sys.path.insert(0, {bench!r})
import path_cpu
from pypool import compiled
compiled.choose()
assert compiled.status.startswith("compiled"), compiled.status
run = path_cpu._serving(path_cpu.pooler_serving({mode!r}, {{}})[1],
                        path_cpu.requests({mode!r}), path_cpu.replies({mode!r}))
run({warm})
run({count})
"""


def libpython() -> str:
    """The file holding CPython's functions: libpython when the interpreter links it, else
    the interpreter itself."""
    name = sysconfig.get_config_var("LDLIBRARY") or ""
    path = Path(sysconfig.get_config_var("LIBDIR") or "") / name
    if name.endswith(".so") or ".so." in name:
        for candidate in (path, Path(str(path) + ".1.0")):
            if candidate.exists():
                return str(candidate)
    return sys.executable


def probe_events(binary: str) -> dict[str, str]:
    """Each function's perf event, adding the probe where it is missing."""
    events = {}
    for function in FUNCTIONS:
        added = subprocess.run(["perf", "probe", "-x", binary, "-a", function],
                               capture_output=True, text=True)
        listed = subprocess.run(["perf", "probe", "-l"], capture_output=True, text=True).stdout
        found = re.search(rf"(probe_\w+):{function}\b", listed)
        if found is None:
            sys.exit(f"no probe for {function}: {added.stderr.strip()}")
        events[function] = f"{found.group(1)}:{function}"
    return events


def counts(tree: str, mode: str, count: int, events: dict[str, str]) -> dict[str, int]:
    """How often each function ran in a child that does `count` transactions."""
    code = DRIVER.format(tree=tree, bench=str(HERE), mode=mode, count=count, warm=WARM)
    stat = subprocess.run(
        ["perf", "stat", "-x", ",", *(arg for event in events.values() for arg in ("-e", event)),
         sys.executable, "-c", code],
        cwd=tree, capture_output=True, text=True, check=True)
    found = {}
    for line in stat.stderr.splitlines():
        fields = line.split(",")
        for function, event in events.items():
            if len(fields) > 2 and fields[2] == event:
                found[function] = int(fields[0])
    return found


def callers(tree: str, mode: str, count: int, event: str) -> None:
    """The two innermost pypool frames of each call of `event`'s function, by count."""
    data = Path("/tmp/generic_calls.perf.data")
    code = DRIVER.format(tree=tree, bench=str(HERE), mode=mode, count=count, warm=WARM)
    subprocess.run(["perf", "record", "-q", "-m", "1024", "-e", event, "--call-graph",
                    "dwarf,4096", "-o", str(data), sys.executable, "-c", code],
                   cwd=tree, check=True, capture_output=True)
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym"],
                            capture_output=True, text=True, check=True).stdout
    sites: collections.Counter[str] = collections.Counter()
    frames: list[str] = []
    for line in script.splitlines() + [""]:
        if not line.strip():
            # Only calls under a Protocol's data_received: the transactions', not the
            # imports' and the set-up's, which both children make.
            if any(frame.endswith("data_received") for frame in frames):
                sites[" <- ".join(frames[:2])] += 1
            frames = []
            continue
        parts = line.split()
        if len(parts) > 1 and parts[1].startswith(("CPyDef_", "CPyPy_")):
            frames.append(parts[1].removeprefix("CPyDef_").removeprefix("CPyPy_"))
    ran = count + WARM  # perf record counts the warm-up's calls too
    for site, hits in sites.most_common(20):
        if hits >= ran // 2:
            print(f"  {hits / ran:5.2f}  {site}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", nargs="?", default=".")
    parser.add_argument("--mode", default="simple", choices=["simple", "extended"])
    parser.add_argument("--transactions", type=int, default=100_000)
    parser.add_argument("--callers", choices=FUNCTIONS,
                        help="which pypool functions make the calls of this one")
    args = parser.parse_args()
    tree = str(Path(args.tree).resolve())
    events = probe_events(libpython())
    if args.callers:
        print(f"calls of {args.callers} per transaction, by their two innermost pypool "
              f"frames (sites at half a call a transaction or more), -M {args.mode}:")
        callers(tree, args.mode, args.transactions // 20, events[args.callers])
        return
    base = counts(tree, args.mode, 0, events)
    run = counts(tree, args.mode, args.transactions, events)
    print(f"{tree}, -M {args.mode}: per transaction (the harness's own calls included)")
    for function in FUNCTIONS:
        print(f"  {(run[function] - base[function]) / args.transactions:6.2f}  {function}")


if __name__ == "__main__":
    main()
