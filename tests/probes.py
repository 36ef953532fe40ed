"""Two probes of a real `inference-studio serve` on the embedded model, the figures of README "Reliability":

python -m tests.probes regex-memory        the twelve distinct blow-up regexes of issue 25, the server's resident
                                           memory (from /proc) before, after each and after 30 s idle
python -m tests.probes beside-long-prompt  a short stream's time to first token alone, then beside a 1,024-message
                                           prompt (6,169 tokens) and a live stream, in the same run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.serving import ServedStudio, start_studio_server

MODEL = "SmolLM2-135M-Instruct"
LIMIT_S = 1800  # the long prompt takes minutes on a loaded 2-core machine


def resident_mib(server: ServedStudio) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return -1


def regex_memory(server: ServedStudio) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    url = f"{server.url}/v1/chat/completions"
    httpx.post(url, json=body, timeout=LIMIT_S)
    before = resident_mib(server)
    print(f"resident before: {before} MiB", flush=True)
    for n in range(1001, 1013):
        started = time.monotonic()
        response = httpx.post(url, json={**body, "guided_regex": f"(a{{{n}}}){{1000}}"}, timeout=LIMIT_S)
        print(f"(a{{{n}}}){{1000}}: {response.status_code} in {time.monotonic() - started:.1f} s, resident "
              f"{resident_mib(server)} MiB", flush=True)  # fmt: skip
    time.sleep(30)
    after = resident_mib(server)
    print(f"resident after 30 s idle: {after} MiB ({after - before:+d} MiB)")


def _stream(url: str, messages: list[dict], max_tokens: int, marks: list[float]) -> None:
    """Stream a reply, noting when each piece of text arrived (seconds from the request)."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    started = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=LIMIT_S) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content": "' in line and '"content": ""' not in line:
                marks.append(time.monotonic() - started)


def beside_long_prompt(server: ServedStudio) -> None:
    short = [{"role": "user", "content": "Hello!"}]
    _stream(server.url, short, 4, [])  # warm
    alone: list[float] = []
    _stream(server.url, short, 4, alone)
    live: list[float] = []
    story = [{"role": "user", "content": "Tell me a long story."}]
    threading.Thread(target=_stream, args=(server.url, story, 1500, live), daemon=True).start()
    time.sleep(3)
    long_marks: list[float] = []
    long_prompt = [{"role": "user", "content": "hi"}] * 1024
    threading.Thread(target=_stream, args=(server.url, long_prompt, 4, long_marks), daemon=True).start()
    time.sleep(3)
    seen = len(live)
    beside: list[float] = []
    _stream(server.url, short, 4, beside)
    gaps = [b - a for a, b in zip(live[seen:], live[seen + 1 :], strict=False)]
    print(f"a short stream's first token: alone {alone[0]:.2f} s, beside the long prompt {beside[0]:.2f} s "
          f"({beside[0] / alone[0]:.1f}x); the live stream meanwhile: {len(live) - seen} tokens, largest gap "
          f"{max(gaps, default=0.0):.2f} s")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probe", choices=["regex-memory", "beside-long-prompt"])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="studio-probe-") as folder:
        server = start_studio_server(["--served-model-name", MODEL], Path(folder))
        try:
            (regex_memory if args.probe == "regex-memory" else beside_long_prompt)(server)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
