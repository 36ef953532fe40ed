"""How much of the CPUs other processes took while this one measured: a timing taken on a busy machine is used for
this start but not remembered as this machine's settled answer (it once kept a slow format for good)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

MIN_WINDOW_S = 0.05  # shorter than this the kernel's tick counts (10 ms) say nothing


@dataclass(frozen=True)
class Snapshot:
    wall: float
    busy_ticks: int  # every CPU's non-idle ticks since boot (/proc/stat)
    cpus: int
    own_seconds: float  # this process's CPU time (every thread)


def snapshot() -> Snapshot | None:
    """Now, or None where /proc/stat can't be read (then nothing is known of the others)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            lines = [line.split() for line in stat if line.startswith("cpu")]
    except OSError:
        return None
    if not lines or lines[0][0] != "cpu" or len(lines[0]) < 6:
        return None
    fields = [int(v) for v in lines[0][1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    times = os.times()
    return Snapshot(time.monotonic(), sum(fields[:8]) - idle, max(1, len(lines) - 1), times.user + times.system)


def others_share(start: Snapshot | None, end: Snapshot | None) -> float | None:
    """The share (0..1) of all CPUs that other processes used between the snapshots; None when unknown."""
    if start is None or end is None or end.wall - start.wall < MIN_WINDOW_S:
        return None
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = (end.busy_ticks - start.busy_ticks) / ticks
    others = busy - (end.own_seconds - start.own_seconds)
    return min(1.0, max(0.0, others / (end.cpus * (end.wall - start.wall))))
