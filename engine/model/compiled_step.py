"""The compiled step: every layer of the lean forward's steps in one C++ call, on a CPU.

csrc/decode_step.cpp is compiled for this CPU on the first start (a C++ compiler and torch's headers; about 10 s on
two cores) and kept in the user cache, keyed by its source, torch, the compiler and the CPU, so later starts load it
in milliseconds. Without a compiler, or when compiling, loading or running it fails, the Python lean forward runs
instead and the reason is in the runtime record.

Why C++ and not torch.compile: measured on the embedded model (one decode row, bfloat16 layers), Inductor compiled the
whole step in 40 s to 23.3 ms against eager's 24.2 ms: it cannot lower the prepacked oneDNN weights, so the linears
stay calls back into Python, and its gathers of the paged cache were slower than index_select. The C++ step is
16 ms on the same weights.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from engine.cxx_build import BuildFailed, build_library
from engine.model import dense_rows, int4pack, kernels, stored, tiles
from engine.model import formats as formats_
from engine.model.batch import CHUNK_COLUMNS
from engine.model.quantized import INT4_GROUP, HalfLinear, Int4Linear, Int8Linear
from engine.paths import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "decode_step.cpp"
COMPILE_TIMEOUT_S = 600
DISABLE_ENV = "INFERENCE_STUDIO_COMPILED_STEP"  # "0": always the Python lean forward
# the -march the step is built for: "native" (this CPU) unless set, or unless torch is held to AVX2 or less
# (ATEN_CPU_CAPABILITY=avx2 or default: a build for an older CPU, the same code a machine without AVX-512 runs)
ARCH_ENV = "INFERENCE_STUDIO_COMPILED_STEP_ARCH"
_ARCH_FOR_ATEN_CAPABILITY = {"avx2": "x86-64-v3", "default": "x86-64-v2"}
# The linear kinds the C++ step computes, by the names decode_step.cpp defines (KINDS): checked against the library's
# contract() when it loads, as are batch.CHUNK_COLUMNS
PACKED, DENSE, INT8, INT4, BLOCKS = "onednn_packed", "dense", "int8", "int4", "bf16_blocks"
KINDS = (PACKED, DENSE, INT8, INT4, BLOCKS)
KV_DTYPES = (torch.float32, torch.bfloat16)  # the KV caches it reads and writes


def rows_up_to(rows: int) -> str:
    """ "1 row" or "1-N rows": the steps a measured product takes (how the record and the experiments say it)."""
    return "1 row" if rows == 1 else f"1-{rows} rows"


class CompileUnavailable(RuntimeError):
    """The compiled step can't be built or loaded here; the message says why in one line."""


class NothingToBuildWith(CompileUnavailable):
    """No compiler or no torch headers: how this machine or package is, not a fault (logged as information)."""


@dataclass
class _State:
    """This process's outcome: the library loaded, or why not (kept: a build is tried once per process)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    loaded: Path | None = None
    failure: str | None = None
    #: the failure is how this machine or package is (turned off, no compiler, no headers or source), not a fault
    expected: bool = False
    #: a build started beside the model's load (prepare_in_background); ensure_loaded waits for it
    building: threading.Thread | None = None


_state = _State()
COMPILING_WORDS = "compiling the decode step for this CPU (first start only)"
# a cached library loads in milliseconds: a build not done within this is compiling, and the stage is named
SETTLE_S = 0.25


def disabled_reason() -> str | None:
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return f"turned off ({DISABLE_ENV}=0)"
    if sys.platform == "win32":
        return "not built on Windows (needs gcc or clang)"
    return None


def _compiler() -> str:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate) or candidate
    raise NothingToBuildWith("no C++ compiler found (install g++ or clang, or set CXX)")


def target_arch() -> str:
    """What -march the step is built for (see ARCH_ENV)."""
    chosen = os.environ.get(ARCH_ENV, "").strip()
    if chosen:
        return chosen
    return _ARCH_FOR_ATEN_CAPABILITY.get(os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower(), "native")


def _flags() -> list[str]:
    from torch.utils import cpp_extension  # torch's own answer to where its headers and libraries are

    headers = cpp_extension.include_paths()
    if not any((Path(path) / "ATen" / "ATen.h").exists() for path in headers):
        raise NothingToBuildWith("torch's C++ headers are not installed here (a packaged studio ships without them)")
    # torch's headers as system headers: the warnings are about our source only, and a build with any is a test failure
    includes = [flag for path in headers for flag in ("-isystem", path)]
    libs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        "-O3", f"-march={target_arch()}", "-ffp-contract=off", "-fopenmp", "-std=c++17", "-Wall", "-Wextra",
        "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes,
        *[f"-L{path}" for path in libs], *[f"-Wl,-rpath,{path}" for path in libs], "-lc10", "-ltorch_cpu", "-ltorch",
    ]  # fmt: skip


def _library_path(compiler: str) -> Path:
    """The cached build for this source, torch, compiler, flags and CPU (-march=native makes it this CPU's)."""
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompileUnavailable(f"the C++ compiler {compiler} does not run: {exc}") from None
    key = hashlib.sha256()
    flags = " ".join(_flags())  # a change of flags (OpenMP) is a new build
    parts = (SOURCE.read_bytes(), torch.__version__.encode(), version.encode(), _cpu_identity().encode(), target_arch())
    parts += (flags,)
    for part in parts:
        part = part.encode() if isinstance(part, str) else part
        key.update(part)
    return cache_dir() / "compiled" / f"decode_step-{key.hexdigest()[:20]}.so"


def _cpu_identity() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            lines = [line for line in info if line.startswith(("model name", "flags"))][:2]
        return "".join(lines)
    except OSError:
        return platform.processor() or platform.machine()


def _compile(compiler: str, target: Path, progress: Callable[[str], None] | None) -> None:
    flags = _flags()  # before the progress message: without torch's headers there is nothing to compile
    if progress is not None:
        progress(COMPILING_WORDS)
    try:
        warnings = build_library(compiler, SOURCE, flags, target, COMPILE_TIMEOUT_S, _warnings_path(target))
    except BuildFailed as exc:
        raise CompileUnavailable(f"compiling the decode step {exc}") from None
    except OSError as exc:
        raise CompileUnavailable(f"the C++ compiler {compiler} does not run: {exc}") from None
    if warnings:
        log.warning("the decode step compiled with %d warnings, the first: %s", len(warnings), warnings[0][:200])


def prepare_in_background() -> None:
    """Build (the first start) and load the compiled step on a thread of its own, beside the model's load: the
    compiler's one thread (about 20 s on two cores) then runs while the loader reads and compiles the GGUF decoders,
    not after them. ensure_loaded() waits for it. Nothing where it is loaded, failed, turned off or under way."""
    with _state.lock:
        if _state.loaded is not None or _state.failure is not None or _state.building is not None:
            return
        if disabled_reason() is not None:
            return
        _state.building = threading.Thread(target=ensure_loaded, name="compiled-step-build", daemon=True)
        _state.building.start()  # it takes the lock once this returns


def _wait_for_background_build(progress: Callable[[str], None] | None) -> None:
    building = _state.building
    if building is None or building is threading.current_thread():
        return
    building.join(SETTLE_S)
    if building.is_alive():
        if progress is not None:
            progress(COMPILING_WORDS)  # what the load now waits for, named
        building.join(COMPILE_TIMEOUT_S + 60)  # its compiler's own limit ends it before this


def _warnings_path(library: Path) -> Path:
    return library.with_suffix(".warnings")


def build_warnings() -> list[str] | None:
    """The compiler's warnings when the loaded library was built (None when none is loaded, or its record is gone)."""
    if _state.loaded is None:
        return None
    try:
        text = _warnings_path(_state.loaded).read_text()
    except OSError:
        return None
    return text.splitlines()


def _check_contract() -> None:
    """The library speaks the contract this Python side does: its linear kinds and chunk table columns."""
    try:
        text = torch.ops.studio.contract()
        parts = dict(part.split(":", 1) for part in text.split(";"))
        kinds, columns = tuple(parts["kinds"].split(",")), tuple(parts["chunk_columns"].split(","))
    except (AttributeError, RuntimeError, KeyError, ValueError) as exc:
        raise CompileUnavailable(f"the compiled step's library states no contract ({exc})") from None
    if not set(KINDS) <= set(kinds) or columns != CHUNK_COLUMNS:
        raise CompileUnavailable(
            f"the compiled step's contract (kinds {kinds}, chunk columns {columns}) is not this Python side's "
            f"(kinds {KINDS}, chunk columns {CHUNK_COLUMNS})"
        )


def ensure_loaded(progress: Callable[[str], None] | None = None) -> bool:
    """Build (first start) and load the compiled step into this process; False with failure_reason() set when it
    can't be. Thread-safe; the outcome is kept for the process."""
    _wait_for_background_build(progress)
    with _state.lock:
        if _state.loaded is not None:
            return True
        reason = disabled_reason()
        if reason is not None:
            _state.failure, _state.expected = reason, True
            return False
        if _state.failure is not None:
            return False
        try:
            compiler = _compiler()
            if not SOURCE.exists():
                raise NothingToBuildWith("its source is not part of this installation (a packaged studio)")
            target = _library_path(compiler)
            if not target.exists():
                _compile(compiler, target, progress)
            try:
                torch.ops.load_library(str(target))
            except (OSError, RuntimeError) as exc:  # a damaged cache entry: build it again once
                log.warning("the cached compiled step did not load (%s); compiling it again", exc)
                target.unlink(missing_ok=True)
                _compile(compiler, target, progress)
                torch.ops.load_library(str(target))
            _check_contract()
        except Exception as exc:  # whatever fails here, the Python layers run and the reason is said
            _state.failure, _state.expected = first_line(exc), isinstance(exc, NothingToBuildWith)
            level = logging.INFO if _state.expected else logging.WARNING
            log.log(level, "compiled decode step unavailable: %s; the Python lean forward runs instead", _state.failure)
            return False
        _state.loaded = target
        log.info("compiled decode step loaded from %s", target)
        return True


def failure_reason() -> str | None:
    return _state.failure


def failure_expected() -> bool:
    """The step is unavailable by how this machine or package is (turned off, nothing to build with), not by a fault:
    what a test may skip for; a failing compile, load or contract is a failure."""
    return _state.failure is not None and _state.expected


def _linear_specs(module: nn.Module) -> list[tuple]:
    """(kind, a, b, bias, group, bfloat16 input, out features) of each linear the module computes side by side, for
    the kernels the C++ step calls; CompileUnavailable for modules it has none for."""
    if isinstance(module, stored.SplitLinear):
        return [spec for part in module.parts for spec in _linear_specs(part)]
    rows = module.out_features
    if isinstance(module, Int8Linear):
        return [(INT8, module.q, module.scale, module.bias, 0, True, rows)]
    if isinstance(module, Int4Linear):
        return [(INT4, module.packed, module.scales_and_zeros, module.bias, INT4_GROUP, True, rows)]
    if isinstance(module, formats_.FormattedLinear):
        if module.blocks is not None:
            return [(BLOCKS, module.blocks, None, module.bias, 0, True, rows)]
        return [(PACKED, module.packed, None, module.bias, 0, module.dtype == torch.bfloat16, rows)]
    if isinstance(module, kernels.PackedLinear):  # its plain rows, where it has them, for the claimed products
        return [(PACKED, module.packed, module.plain, module.bias, 0, False, rows)]
    if isinstance(module, HalfLinear) or type(module) is nn.Linear:
        weight = module.weight.detach()
        if weight.dtype not in (torch.float32, torch.bfloat16):
            raise CompileUnavailable(f"{weight.dtype} weights have no compiled kernel")
        return [(DENSE, weight, None, module.bias, 0, weight.dtype == torch.bfloat16, rows)]
    raise CompileUnavailable(f"{type(module).__name__} linears have no compiled kernel")


class CompiledStep:
    """One weight format's layers in the C++ step: forward(hidden, cos, sin, storage, chunks, pages) -> hidden."""

    def __init__(
        self, fast, linears, progress: Callable[[str], None] | None = None, like: CompiledStep | None = None
    ) -> None:
        """like: the whole model's step, whose measured row counts a part of it takes (unmeasured)."""
        self.model = torch.classes.studio.DecodeModel(
            fast.heads, fast.kv_heads, fast.head_dim, fast.hidden, fast.intermediate, float(fast.eps), fast.scale
        )
        largest: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # by kind: the weight the tiles are measured on
        widest_int4: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # by input width: the largest int4 weight
        plain_weights: list[tuple[torch.Tensor | None, torch.Tensor]] = []  # float weights: (prepacked, plain rows)
        for layer, modules in zip(fast.layers, linears.layers, strict=True):
            self.model.add_layer(layer.input_norm.float(), layer.post_norm.float(), layer.sliding_window or 0)
            for slot, module in enumerate(modules):
                for kind, a, b, bias, group, bf16, rows in _linear_specs(module):
                    self.model.add_linear(slot, kind, a, b, None if bias is None else bias.float(), group, bf16, rows)
                    if kind == PACKED and b is not None:
                        plain_weights.append((a, b))
                    elif kind == DENSE:
                        plain_weights.append((None, a))
                    if kind in (INT4, INT8) and (kind not in largest or a.numel() > largest[kind][0].numel()):
                        largest[kind] = (a, b)
                    width = a.shape[1] * 2 if kind == INT4 else 0  # two codes a byte
                    if width and (width not in widest_int4 or a.numel() > widest_int4[width][0].numel()):
                        widest_int4[width] = (a, b)
        #: rows from which int4 / int8 weights are multiplied as bfloat16 tiles (0: never)
        self.tiles_from = (
            {kind: like.tiles_from.get(kind, 0) for kind in largest}
            if like is not None
            else {kind: tiles.tiles_from(kind, *weight, progress) for kind, weight in largest.items()}
        )
        layout = int4pack.layout()
        self.model.use_tiles(
            self.tiles_from.get(INT4, 0), self.tiles_from.get(INT8, 0), layout.block if layout else 0,
            bool(layout and layout.split),
        )  # fmt: skip
        #: per input width, the rows for which int4 weights multiply int8 activations (VNNI, AMX), measured on the
        #: largest weight of that width: how a block's weights stay in cache differs with it
        self.vnni_rows: dict[int, tiles.Int8Activations] = {}
        for width, weight in widest_int4.items():
            rows = like.vnni_rows.get(width, tiles.NEVER) if like is not None else None
            if rows is None:
                rows = tiles.vnni_rows(*weight, self.tiles_from.get(INT4, 0), progress)
            self.vnni_rows[width] = rows
            if rows.first:
                self.model.use_vnni(width, *rows)
        #: the rows for which int8 weights multiply int8 activations (VNNI, AMX), measured on the largest
        self.int8_rows = tiles.NEVER
        if INT8 in largest:
            self.int8_rows = (
                like.int8_rows
                if like is not None
                else tiles.int8_rows(*largest[INT8], self.tiles_from.get(INT8, 0), progress)
            )
            if self.int8_rows.first:
                self.model.use_int8_activations(*self.int8_rows)
        #: steps of at most these many rows multiply the float weights by claimed dot products (0: never)
        self.claimed_to = like.claimed_to if like is not None else dense_rows.claimed_to(plain_weights, progress)
        #: how many of the step's linears take them at those row counts
        self.claimed_linears = int(self.model.use_claimed(self.claimed_to))

    @property
    def int8_activations(self) -> bool:
        """Some weights here multiply int8 activations for some row counts (their rounding is in the check's bound)."""
        return bool(self.int8_rows.first or any(rows.first for rows in self.vnni_rows.values()))

    @property
    def tiles_everywhere(self) -> bool:
        """Every int4/int8 weight here multiplies as tiles from some row count (at most tiles.BUCKETS' last): a
        prompt's many rows run here too (brgemm's tiles: 1.3-3x faster at 64-256 rows than Python's oneDNN tiles)."""
        return all(self.tiles_from.values())

    @property
    def tiles_note(self) -> str | None:
        """ "bfloat16 tiles for int4 from 9 rows, int8 from 5 rows; int8 activations for int4 2048-wide at 5-16 rows",
        or None where every step keeps torch's kernels."""
        parts = []
        if used := [f"{kind} from {rows} rows" for kind, rows in sorted(self.tiles_from.items()) if rows]:
            parts.append(f"bfloat16 tiles for {', '.join(used)}")
        if (int8 := self.int8_rows).first:
            on_amx = f" (AMX from {int8.amx_from})" if int8.amx_from else ""
            parts.append(f"int8 activations for int8 at {int8.first}-{int8.last} rows{on_amx}")
        if ranges := sorted((width, rows) for width, rows in self.vnni_rows.items() if rows.first):
            amx = {width: f" (AMX from {rows.amx_from})" if rows.amx_from else "" for width, rows in ranges}
            spans = ", ".join(f"{w}-wide at {r.first}-{r.last} rows{amx[w]}" for w, r in ranges)
            parts.append(f"int8 activations for int4 {spans}")
        if self.claimed_to and self.claimed_linears:
            parts.append(
                f"claimed dot products for {self.claimed_linears} float linears at {rows_up_to(self.claimed_to)}"
            )
        return "; ".join(parts) or None

    def forward(self, hidden, cos, sin, storage, chunks, pages) -> torch.Tensor:
        # the step hands its arguments back after its output (decode_step.cpp: let go here, with the interpreter lock)
        return self.model.forward(hidden, cos, sin, storage, chunks, pages)[0]


def build_steps(
    fast, linear_sets: dict, progress: Callable[[str], None] | None = None, like: dict | None = None
) -> tuple[dict[str, CompiledStep], str | None]:
    """The compiled step for each weight format that has one, and why there is none where there isn't. progress: told
    what is measured while they are built (the status bar). like: steps already built for the whole model, whose
    measured tiles these take (a part of the model for the fast path's check runs the same routes, unmeasured)."""
    if fast.device.type != "cpu" or fast.dtype != torch.float32:
        return {}, "float32 activations on a CPU only"
    if not ensure_loaded():
        return {}, failure_reason()
    steps: dict[str, CompiledStep] = {}
    reasons = []
    for fmt, linears in linear_sets.items():
        try:
            steps[fmt] = CompiledStep(fast, linears, progress, like[fmt] if like is not None and fmt in like else None)
        except Exception as exc:  # whatever a format's weights make the C++ refuse: that format runs in Python
            reasons.append(f"{fmt}: {first_line(exc)}")
    return steps, "; ".join(reasons) or None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]
