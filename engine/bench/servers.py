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
from dataclasses import dataclass, field
from pathlib import Path

READY = re.compile(r"(?:serving .* at |READY )(http://[\w.\[\]:-]+)(?:/v1)?(.*)")


@dataclass
class ServerProcess:
    """A server process started by `command`, ready once it prints its URL (the studio's `serving ... at URL/v1`
    line, or llama_server's `READY URL {flags}`)."""

    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 600.0
    url: str = ""
    details: str = ""
    _process: subprocess.Popen | None = None
    _log: Path | None = None

    def __enter__(self) -> ServerProcess:
        handle, log = tempfile.mkstemp(prefix=f"bench-{self.name}-", suffix=".log")
        os.close(handle)
        self._log = Path(log)
        with self._log.open("wb") as out:
            self._process = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
            )
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            text = self._log.read_text(errors="replace")
            match = READY.search(text)
            if match:
                self.url, self.details = match.group(1), match.group(2).strip()
                return self
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self._process.returncode}: {_tail(text)}")
            time.sleep(0.1)
        self.__exit__()
        raise TimeoutError(f"{self.name} did not become ready within {self.ready_timeout_s:.0f} s")

    def __exit__(self, *exc) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT if sys.platform != "win32" else signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._log is not None:
            self._log.unlink(missing_ok=True)


def _tail(text: str, lines: int = 8) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


def llama_cpp_available() -> str | None:
    """None when llama.cpp's server can run here, else why not."""
    if importlib.util.find_spec("xllamacpp") is None:
        return "xllamacpp is not installed (pip install 'inference-studio[bench]')"
    return None


def llama_cpp_server(gguf: str, threads: int, slots: int, ctx: int) -> ServerProcess:
    command = [sys.executable, "-m", "engine.bench.llama_server", "--model", gguf, "--port", "0"]
    command += ["--threads", str(threads), "--slots", str(slots), "--ctx", str(ctx)]
    return ServerProcess("llama-cpp-server", command)


def studio_server(serve_command: list[str], options: list[str], threads: int) -> ServerProcess:
    """`serve_command` is how this installation runs `inference-studio serve` (the CLI passes its own)."""
    command = [*serve_command, "--port", "0", "--served-model-name", "bench", *options]
    return ServerProcess("studio-server", command, env={"OMP_NUM_THREADS": str(threads)})
