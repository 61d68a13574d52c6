"""CPU time and resident memory of a process tree, read from /proc.

CPU is ``utime + stime + cutime + cstime`` summed over a process and its live
descendants: a child's time moves into its parent's ``cutime``/``cstime`` when the parent
reaps it, so the sum stays correct across exiting children (PostgreSQL backends, pooler
workers). Take the difference of two samples to get the CPU spent in between.
"""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) is in parentheses and may contain spaces.
    return text[text.rindex(")") + 2 :].split()


def tree_pids(root: int) -> list[int]:
    """Return ``root`` and all its descendants that are alive now."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                parent = int(stat_fields(int(entry.name))[1])
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        stack.extend(children.get(pid, []))
    return pids


def cpu_seconds(root: int) -> float:
    """CPU seconds used so far by ``root``'s tree, including reaped children."""
    ticks = 0
    for pid in tree_pids(root):
        try:
            fields = stat_fields(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
        # Fields 14-17 of /proc/PID/stat: utime stime cutime cstime (index 11-14 here).
        ticks += sum(int(value) for value in fields[11:15])
    return ticks / CLOCK_TICKS


def rss_bytes(root: int) -> int:
    """Sum of VmRSS over ``root``'s tree."""
    total = 0
    for pid in tree_pids(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total
