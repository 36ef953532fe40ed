"""Running the C++ compiler for a library the studio builds at run time (the loader's GGUF decoders, the compiled
decode step): a child the process stops, its partial file removed, when the process exits mid-build."""

from __future__ import annotations

import atexit
import contextlib
import subprocess
import threading
from pathlib import Path

_running: dict[subprocess.Popen, Path] = {}  # compiler -> the partial file it writes
_lock = threading.Lock()


def run_compiler(command: list[str], partial: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout_s), with the compiler stopped if the
    process exits first: a build on a thread dies with the process, its compiler would not (it would go on writing
    `partial` into the cache). Raises subprocess.TimeoutExpired (the compiler killed) and OSError as run does."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with _lock:
        _running[process] = partial
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    finally:
        with _lock:
            _running.pop(process, None)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@atexit.register
def _stop_running() -> None:
    """The process exits while a build runs (a load refused, the window closed on the first start)."""
    with _lock:
        running = list(_running.items())
    for process, partial in running:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        partial.unlink(missing_ok=True)
