"""HTTP servers the benchmark starts as processes of their own: the studio's `serve` and llama.cpp's server."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.bench.process_watch import GIB, ProcessWatch

READY = re.compile(r"(?:serving .* at |READY )(http://[\w.\[\]:-]+)(?:/v1)?(.*)")
PROGRESS = re.compile(r"^\[([^\]\n]+)\]$", re.MULTILINE)  # the studio's `[loading ...]` lines


class ServerFailed(RuntimeError):
    """A server that exited, was killed, passed its memory cap or did not become ready in time: the message says
    which, with the peak resident memory it reached (`peak_rss`, bytes) and when (`after_s`, from its start)."""

    def __init__(self, message: str, peak_rss: int, after_s: float) -> None:
        super().__init__(message)
        self.peak_rss = peak_rss
        self.after_s = after_s


@dataclass
class ServerProcess:
    """A server process started by `command`, ready once it prints its URL (the studio's `serving ... at URL/v1`
    line, or llama_server's `READY URL {flags}`). Its /proc figures are read while it runs (`watch`); past
    `memory_cap_bytes` of resident memory it is killed and said so."""

    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 600.0
    memory_cap_bytes: int | None = None
    url: str = ""
    details: str = ""
    started_at: float = 0.0  # time.perf_counter() (the streaming client's clock) just before the process started
    ready_at: float = 0.0
    watch: ProcessWatch | None = None
    on_progress: Callable[[str], None] | None = None  # told each `[progress]` line the server prints while starting
    _process: subprocess.Popen | None = None
    _log: Path | None = None

    def __enter__(self) -> ServerProcess:
        handle, log = tempfile.mkstemp(prefix=f"bench-{self.name}-", suffix=".log")
        os.close(handle)
        self._log = Path(log)
        with self._log.open("wb") as out:
            self.started_at = time.perf_counter()
            self._process = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
            )
        self.watch = ProcessWatch(self._process.pid, self.memory_cap_bytes).__enter__()
        deadline = self.started_at + self.ready_timeout_s
        told = 0
        try:
            while time.perf_counter() < deadline:
                text = self._log.read_text(errors="replace")
                if self.on_progress:
                    lines = PROGRESS.findall(text)
                    for line in lines[told:]:
                        self.on_progress(line)
                    told = len(lines)
                match = READY.search(text)
                if match:
                    self.url, self.details = match.group(1), match.group(2).strip()
                    self.ready_at = time.perf_counter()
                    return self
                if self._process.poll() is not None:
                    raise self.failure(f"{self.name} did not start")
                time.sleep(0.1)
            raise self.failure(f"{self.name} did not become ready within {self.ready_timeout_s:.0f} s", stop=True)
        except BaseException:
            self.__exit__()
            raise

    def failure(self, what: str, stop: bool = False) -> ServerFailed:
        """Why the process is not serving (stopped first if `stop`): exit status or signal, the cap, its last lines."""
        if stop:
            self._stop()
        assert self._process is not None and self.watch is not None
        code = self._process.poll()
        watch = self.watch
        if watch.capped_at is not None:
            cap = (watch.cap_bytes or 0) / GIB
            why = f"stopped by the bench: resident memory passed the {cap:.1f} GiB cap"
        elif stop:
            why = "stopped by the bench"
        elif code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            why = f"killed by {name}"
            if -code == signal.SIGKILL:
                why += " (the kernel's out-of-memory killer or a memory limit, most likely)"
        else:
            why = f"exited with status {code}"
        text = self._log.read_text(errors="replace") if self._log else ""
        after = time.perf_counter() - self.started_at
        message = f"{what}: {why} after {after:.0f} s, peak resident {watch.peak_rss / GIB:.2f} GiB"
        if text.strip():
            message += f"; last output: {_tail(text, 3)}"
        return ServerFailed(message, watch.peak_rss, after)

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _stop(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT if sys.platform != "win32" else signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    def __exit__(self, *exc) -> None:
        self._stop()
        if self.watch is not None:
            self.watch.__exit__()
        if self._log is not None:
            self._log.unlink(missing_ok=True)


def _tail(text: str, lines: int = 8) -> str:
    """The last lines, joined on one line; of a progress bar's updates (carriage returns split them into lines of
    the same beginning) only the last."""
    kept: list[str] = []
    for line in (raw.strip() for raw in text.strip().splitlines()):
        if kept and line[:16] == kept[-1][:16]:
            kept[-1] = line
        elif line:
            kept.append(line)
    return " / ".join(kept[-lines:])


def llama_cpp_available() -> str | None:
    """None when llama.cpp's server can run here, else why not."""
    if importlib.util.find_spec("xllamacpp") is None:
        return "xllamacpp is not installed (pip install 'inference-studio[bench]')"
    return None


def llama_cpp_server(gguf: str, threads: int, slots: int, ctx: int, **limits) -> ServerProcess:
    """`limits`: ready_timeout_s, memory_cap_bytes."""
    command = [sys.executable, "-m", "engine.bench.llama_server", "--model", gguf, "--port", "0"]
    command += ["--threads", str(threads), "--slots", str(slots), "--ctx", str(ctx)]
    return ServerProcess("llama-cpp-server", command, **limits)


def studio_server(serve_command: list[str], options: list[str], threads: int, **limits) -> ServerProcess:
    """`serve_command` is how this installation runs `inference-studio serve` (the CLI passes its own)."""
    command = [*serve_command, "--port", "0", "--served-model-name", "bench", *options]
    return ServerProcess("studio-server", command, env={"OMP_NUM_THREADS": str(threads)}, **limits)
