"""CPU accounting from /proc for the bench scripts (Linux)."""
from __future__ import annotations

import os
import time


def process_cpu_seconds(pids) -> float:
    """User+system CPU seconds used so far by these processes (gone ones count 0)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def machine_cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]          # idle + iowait
    return sum(v) - idle, sum(v)


def wait_idle(pids, limit: float = 30.0, cores: float = 0.05, also=lambda: True) -> float:
    """Wait until these processes use under ``cores`` CPUs for 0.5 s (and ``also()`` holds),
    at most ``limit`` seconds; return the seconds waited. A bench waits so after writing
    what it then measures: the bookies' write-cache flushes, checkpoints and garbage
    collection of what was just written or deleted would otherwise run under the
    measurement."""
    pids = list(pids)
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        c0 = process_cpu_seconds(pids)
        time.sleep(0.5)
        if process_cpu_seconds(pids) - c0 < cores * 0.5 and also():
            break
    return time.monotonic() - t0
