"""The loader's C++ decoders (csrc/gguf_decode.cpp): GGUF blocks into int4 packings, int8 rows and float32 in one pass,
compiled for this CPU on the first load that needs them (a C++ compiler and torch's headers, a few seconds) and kept
in the user cache, keyed by the source, torch, the compiler and the CPU. Without them (a packaged studio, no compiler,
a failed build) the torch decoders run: the same values, several times slower."""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import torch

from engine.cxx_build import BuildFailed, build_library
from engine.paths import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "gguf_decode.cpp"
VERSION = "gguf_decode 6"  # what the library's version() says: a stale build is rebuilt
DISABLE_ENV = "INFERENCE_STUDIO_NATIVE_LOADER"  # "0": the torch decoders only
COMPILE_TIMEOUT_S = 600
_lock = threading.Lock()
_state: dict[str, object] = {}


def available(progress=None) -> bool:
    """Whether the C++ decoders are loaded in this process (built first if needed); tried once per process."""
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])
        try:
            _load(progress)
            _state["ok"] = True
        except Exception as exc:  # whatever fails, the torch decoders run; said once
            _state["ok"], _state["reason"] = False, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.info("the loader's C++ decoders are unavailable (%s); torch's decode the file", _state["reason"])
        return bool(_state["ok"])


def unavailable_reason() -> str | None:
    return _state.get("reason")  # type: ignore[return-value]


def _load(progress) -> None:
    if os.environ.get(DISABLE_ENV, "1") == "0":
        raise RuntimeError(f"turned off ({DISABLE_ENV}=0)")
    if sys.platform == "win32":
        raise RuntimeError("not built on Windows")
    if not SOURCE.exists():
        raise RuntimeError("its source is not part of this installation")
    candidates = (os.environ.get("CXX"), "c++", "g++", "clang++")
    compiler = next((shutil.which(c) for c in candidates if c and shutil.which(c)), None)
    if compiler is None:
        raise RuntimeError("no C++ compiler found")
    target = _library_path(compiler)
    if not target.exists():
        _compile(compiler, target, progress)
    torch.ops.load_library(str(target))
    if torch.ops.studio_gguf.version() != VERSION:
        raise RuntimeError(f"the library says {torch.ops.studio_gguf.version()!r}, not {VERSION!r}")


def _arch() -> str:
    # an older CPU's build when torch is held to one (tests emulate such machines), else this CPU's
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    return {"avx2": "x86-64-v3", "default": "x86-64-v2"}.get(capability, "native")


def _flags() -> list[str]:
    from torch.utils import cpp_extension

    headers = cpp_extension.include_paths()
    if not any((Path(path) / "ATen" / "ATen.h").exists() for path in headers):
        raise RuntimeError("torch's C++ headers are not installed here")
    libs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        "-O3", f"-march={_arch()}", "-ffp-contract=off", "-fopenmp", "-std=c++17", "-Wall", "-Wextra", "-shared",
        "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *[flag for path in headers for flag in ("-isystem", path)],
        *[f"-L{path}" for path in libs], *[f"-Wl,-rpath,{path}" for path in libs], "-lc10", "-ltorch_cpu", "-ltorch",
    ]  # fmt: skip


def _library_path(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = "".join([line for line in info if line.startswith(("model name", "flags"))][:2])
    except OSError:
        cpu = platform.processor() or platform.machine()
    key = hashlib.sha256()
    flags = " ".join(_flags()).encode()  # a change of flags (OpenMP) is a new build
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), version.encode(), cpu.encode(), _arch().encode()):
        key.update(part)
    key.update(flags)
    return cache_dir() / "compiled" / f"gguf_decode-{key.hexdigest()[:20]}.so"


def _compile(compiler: str, target: Path, progress) -> None:
    flags = _flags()
    if progress is not None:
        progress("compiling the GGUF decoders for this CPU (first load only)")
    try:
        warnings = build_library(compiler, SOURCE, flags, target, COMPILE_TIMEOUT_S)
    except BuildFailed as exc:
        raise RuntimeError(f"compiling {exc}") from None
    if warnings:
        log.warning("the GGUF decoders compiled with %d warnings, the first: %s", len(warnings), warnings[0][:200])


def dequantize(raw: torch.Tensor, kind: int) -> torch.Tensor:
    return torch.ops.studio_gguf.dequantize(raw.contiguous(), int(kind))


def int8_rows(raw: torch.Tensor, kind: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.studio_gguf.int8_rows(raw.contiguous(), int(kind))


def int4_pack(raw: torch.Tensor, kind: int, block: int, split: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.studio_gguf.int4_pack(raw.contiguous(), int(kind), block, split)


def int4_pack_into(raw: torch.Tensor, kind: int, block: int, split: bool, packed: torch.Tensor, sz: torch.Tensor):
    """int4_pack written into rows of joint buffers (engine/load/joined.py): packed contiguous, sz a row slice."""
    torch.ops.studio_gguf.int4_pack_into(raw.contiguous(), int(kind), block, split, packed, sz)


def int8_rows_into(raw: torch.Tensor, kind: int, q: torch.Tensor, scales: torch.Tensor) -> None:
    """int8_rows written into rows of joint buffers (engine/load/joined.py)."""
    torch.ops.studio_gguf.int8_rows_into(raw.contiguous(), int(kind), q, scales)


def int4_unpack(packed: torch.Tensor, scales_and_zeros: torch.Tensor, block: int, split: bool, row0: int, rows: int):
    """bfloat16 [rows, K] of rows row0.. of an int4 packing (whole packing blocks)."""
    return torch.ops.studio_gguf.int4_unpack(packed, scales_and_zeros, block, split, row0, rows)
