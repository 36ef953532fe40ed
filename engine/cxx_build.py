"""Building a library the studio compiles at run time (the loader's GGUF decoders, the compiled decode step): into a
partial file published atomically, the compiler a child the process stops (its partial file removed) when the process
exits mid-build."""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import threading
from pathlib import Path

_running: dict[subprocess.Popen, Path] = {}  # compiler -> the partial file it writes
_lock = threading.Lock()


class BuildFailed(RuntimeError):
    """The compiler ran and failed, or ran past its limit: the message says which in a line ("failed: <its first
    error>", "took over N s"), for the caller to prefix with what it compiled."""


def build_library(
    compiler: str, source: Path, flags: list[str], target: Path, timeout_s: float, warnings_record: Path | None = None
) -> list[str]:
    """Compile `source` into `target` and return the compiler's warnings. Another process sees the whole library or
    none: it is written to a partial file of this process and thread, then renamed; nothing is left behind on a
    failure. warnings_record: a file the warnings are written to before the library appears. Raises BuildFailed, and
    OSError where the compiler does not run."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        done = run_compiler([compiler, str(source), "-o", str(partial), *flags], partial, timeout_s)
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        raise BuildFailed(f"took over {timeout_s:g} s") from None
    output = done.stderr or done.stdout or ""
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        errors = [line for line in output.splitlines() if "error" in line.lower()]
        detail = (errors or output.splitlines() or ["no output"])[0].strip()
        raise BuildFailed(f"failed: {detail[:200]}")
    warnings = [line for line in (done.stderr or "").splitlines() if "warning:" in line]
    if warnings_record is not None:
        warnings_record.write_text("\n".join(warnings))
    os.replace(partial, target)
    return warnings


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
