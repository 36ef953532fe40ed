"""What a server process takes from the machine, read from /proc while it runs: resident memory (VmRSS, its peak
VmHWM, the anonymous and file-backed parts), bytes it had written to disk, and a memory cap it is stopped at."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3


@dataclass(frozen=True)
class ProcessSample:
    """One reading of /proc/PID (bytes). File-backed pages (a memory-mapped model file) count in rss and hwm, as
    the kernel counts them; write_bytes is None where /proc/PID/io cannot be read."""

    at: float  # time.perf_counter(), the clock of the streaming client's timings
    rss: int
    hwm: int
    rss_anon: int
    rss_file: int
    write_bytes: int | None


def read_sample(pid: int) -> ProcessSample | None:
    """None once the process is gone (or on a system without /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[key] = int(parts[0]) * 1024
    if "VmRSS" not in fields:  # a zombie has no memory lines left
        return None
    return ProcessSample(
        at=time.perf_counter(),
        rss=fields["VmRSS"],
        hwm=fields.get("VmHWM", fields["VmRSS"]),
        rss_anon=fields.get("RssAnon", 0),
        rss_file=fields.get("RssFile", 0) + fields.get("RssShmem", 0),
        write_bytes=_write_bytes(pid),
    )


def _write_bytes(pid: int) -> int | None:
    """Bytes the process (and its reaped children) caused to be written to storage, counted as pages are dirtied."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def process_age_s(pid: int | str = "self") -> float | None:
    """Seconds since the process started, from /proc (the kernel's start time, at its clock tick: 10 ms), or None
    where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of the whole line: starttime
    return max(0.0, uptime - started)


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class ProcessWatch:
    """Reads /proc/PID every `interval_s` on a thread of its own, keeps the peak and the last reading (a process
    that died keeps its figures), and kills the process (SIGKILL) the first time its resident memory passes
    `cap_bytes`: a row that says "passed the cap at N GiB" instead of the machine's OOM killer picking a victim.
    Between two readings the process may overshoot the cap by what it allocates in `interval_s`."""

    def __init__(self, pid: int, cap_bytes: int | None = None, interval_s: float = 0.05) -> None:
        self.pid = pid
        self.cap_bytes = cap_bytes
        self.interval_s = interval_s
        self.last: ProcessSample | None = None
        self.peak_rss = 0
        self.capped_at: ProcessSample | None = None  # the reading that passed the cap
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"watch-{pid}", daemon=True)

    def __enter__(self) -> ProcessWatch:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sample(self) -> ProcessSample | None:
        """Read now; None if the process is gone (then `last` holds its final figures)."""
        reading = read_sample(self.pid)
        if reading is None:
            return None
        with self._lock:
            self.last = reading
            self.peak_rss = max(self.peak_rss, reading.hwm, reading.rss)
            if self.cap_bytes and reading.rss > self.cap_bytes and self.capped_at is None:
                self.capped_at = reading
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGKILL)
        return reading

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.sample() is None:
                return
