"""Start `inference-studio serve` as a real subprocess on a free loopback port, read its /metrics, stop it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

READY = re.compile(r"serving '.*' at (http://\S+)/v1")


def studio_command() -> list[str]:
    script = Path(sys.executable).with_name("inference-studio")
    return [str(script)] if script.exists() else [sys.executable, "-m", "app"]


@dataclass
class ServedStudio:
    process: subprocess.Popen
    url: str  # http://127.0.0.1:PORT, without /v1
    stdout_path: Path
    stderr_path: Path

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def logs(self) -> str:
        return self.stdout_path.read_text(errors="replace") + self.stderr_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, by name with its labels, e.g. 'vllm:prompt_tokens_total{model_name="tiny"}'."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}"] = sample.value
                samples.setdefault(sample.name, 0.0)
                if "le" not in sample.labels:
                    samples[sample.name] += sample.value  # summed over label sets, for quick checks
        return samples

    def wait_for_metric(self, name: str, predicate, timeout: float = 30.0) -> float:
        deadline = time.monotonic() + timeout
        while True:
            value = self.metrics().get(name)
            if value is not None and predicate(value):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} is {value} after {timeout} s")
            time.sleep(0.1)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


def start_studio_server(
    args: list[str], folder: Path, env: dict[str, str] | None = None, timeout: float = 180.0
) -> ServedStudio:
    """Run `inference-studio -v serve --port 0 ARGS` (verbose: the key-leak checks read every log line)."""
    folder.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = folder / "stdout.txt", folder / "stderr.txt"
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        process = subprocess.Popen(
            [*studio_command(), "-v", "serve", "--port", "0", *args], stdout=out, stderr=err, env=full_env
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = READY.search(stdout_path.read_text(errors="replace"))
        if match:
            return ServedStudio(process, match.group(1), stdout_path, stderr_path)
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n{stderr_path.read_text()}")
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"the server did not start within {timeout} s:\n{stderr_path.read_text()}")


def cache_the_chat_prompt(client, **ask) -> None:
    """One chat request first, so that the greedy replies compared after it both find the prompt's pages cached and
    compute the same tail. A fresh prompt is computed in one prefill, a cached one's last tokens alone: where the
    machine measured different weight formats for those row counts (dtype auto), the two round differently, and a
    greedy near-tie can go either way."""
    ask = {key: value for key, value in ask.items() if key not in ("stream", "stream_options", "max_tokens")}
    extra = {key: value for key, value in ask.pop("extra_body", {}).items() if key != "min_tokens"}
    if extra:
        ask["extra_body"] = extra
    client.chat.completions.create(**ask, max_tokens=1)
