"""Weight formats of the lean forward's linears, and the fastest one for each batch size, measured on this model's
own layers on this machine when it loads (bfloat16 GEMMs read half the bytes of float32 ones, which wins where
decode is bound by memory bandwidth, but loses to float32 on CPUs without bfloat16 instructions at larger batches)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from engine.model import contention, kernels
from engine.model import remembered as remembered_
from engine.model.quantized import Int4Linear, Int8Linear
from engine.model.weights import BFLOAT16, FLOAT32, INT4, INT8
from engine.paths import cache_dir

log = logging.getLogger(__name__)

BUCKETS = (1, 4, 16, 64)  # rows a step multiplies: a few decode rows ... many rows or a prefill chunk
DTYPES = {FLOAT32: torch.float32, BFLOAT16: torch.bfloat16}
QUANTIZED = {INT8: Int8Linear, INT4: Int4Linear}


class FormattedLinear(nn.Module):
    """A float32 linear computed in another weight format: inputs cast to it, outputs back to float32, the bias
    added in float32. Prepacked for oneDNN on CPU; bfloat16 in the compiled library's blocks where this machine
    measured them faster (engine/model/bf16_blocks.py: float32 sums, not rounded to bfloat16)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fmt: str, blocks_allowed: bool = True) -> None:
        """blocks_allowed: False keeps oneDNN's packing without asking whether blocks are faster here (which measures,
        once a machine: 2.3 s of a first start that makes no bfloat16 copy at all)."""
        super().__init__()
        from engine.model import bf16_blocks  # it loads the compiled library, whose builder imports this module

        self.dtype = DTYPES[fmt]
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.packed: torch.Tensor | None = None
        self.blocks: torch.Tensor | None = None
        if self.dtype == torch.bfloat16 and self.in_features % 2 == 0 and blocks_allowed and bf16_blocks.use_blocks():
            self.blocks = torch.ops.studio.bf16_blocks(weight.detach())
        else:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(self.dtype).contiguous(), 16)
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(self.dtype)
        if self.blocks is not None:
            out = torch.ops.studio.bf16_blocks_mm(rows, self.blocks)[:, : self.out_features]
        else:
            out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, None, "none", [], "").float()
        if self.bias is not None:
            out += self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, fmt: str) -> nn.Module:
    """A float32-in, float32-out linear whose weight is kept (and multiplied) in `fmt`."""
    if fmt in QUANTIZED:
        return QUANTIZED[fmt](weight, bias)
    return FormattedLinear(weight, bias, fmt)


def usable(fmt: str, device: torch.device) -> bool:
    """The format's kernel runs here (a CPU with oneDNN, torch's weight-only kernels) and computes the linear;
    whether it is faster is measured."""
    if device.type != "cpu" or (fmt == BFLOAT16 and not kernels.onednn_packing_available()):
        return False
    try:
        weight, x = torch.randn(64, 64), torch.randn(3, 64)
        with torch.inference_mode():  # oneDNN's bfloat16 product: the blocks are checked where they are chosen
            linear = FormattedLinear(weight, None, fmt, blocks_allowed=False) if fmt in DTYPES else None
            out = (linear if linear is not None else make_linear(weight, None, fmt))(x)
        expected = x @ weight.T
        return bool((out - expected).abs().max() < 0.25 * expected.abs().max())  # 4 bits round; a bug is way off
    except Exception:  # an internal op missing from this torch build, or unfit for this CPU
        return False


def bfloat16_usable(device: torch.device) -> bool:
    return usable(BFLOAT16, device)


@dataclass
class FormatChoice:
    """The format used for each bucket of rows, and the measurements it came from (ms per pass over every linear
    of the model)."""

    chosen: dict[int, str]
    timings_ms: dict[str, dict[int, float]] = field(default_factory=dict)
    measured_on: str = ""  # what a pass covered: "4 of 30 layers"

    def format_for(self, rows: int) -> str:
        for bucket in sorted(self.chosen):
            if rows <= bucket:
                return self.chosen[bucket]
        return self.chosen[max(self.chosen)]

    @property
    def formats(self) -> set[str]:
        return set(self.chosen.values())

    def describe(self) -> str:
        spans = ", ".join(f"{rows} row{'s' if rows > 1 else ''}: {fmt}" for rows, fmt in sorted(self.chosen.items()))
        if not self.timings_ms:
            return spans
        ms = "; ".join(
            f"{fmt} " + "/".join(f"{self.timings_ms[fmt][b]:.1f}" for b in sorted(self.timings_ms[fmt]))
            for fmt in self.timings_ms
        )
        over = f" over {self.measured_on}" if self.measured_on else ""
        return f"{spans} (measured ms per pass{over} at {'/'.join(map(str, sorted(self.chosen)))} rows: {ms})"


def single(fmt: str) -> FormatChoice:
    return FormatChoice({bucket: fmt for bucket in BUCKETS})


def measure(
    passes: dict[str, Callable[[int], None]],
    buckets: Sequence[int] = BUCKETS,
    key: str | None = None,
    layers: str = "",
    budget_s: float | None = None,
) -> FormatChoice:
    """passes[format](rows) runs every linear of the measured layers once on `rows` rows; the fastest format per
    bucket wins. Formats are timed in turns (a busy spell of a shared machine hits them alike) and compared by their
    medians, for up to ROUNDS rounds or until budget_s (MEASURE_BUDGET_S) is spent, at least one. With a key (this
    machine, model shape, torch), the choice is remembered in the user cache: later starts are instant and choose
    alike."""
    found = _remembered(key, passes, buckets)
    if found is not None:
        return found
    budget_s = MEASURE_BUDGET_S if budget_s is None else budget_s
    before = contention.snapshot()
    samples: dict[str, dict[int, list[float]]] = {fmt: {rows: [] for rows in buckets} for fmt in passes}
    started = time.perf_counter()
    with torch.inference_mode():
        for rows in buckets:
            for run in passes.values():
                run(rows)  # warm-up: oneDNN creates its primitives on the first call
        for done in range(ROUNDS):
            if done and time.perf_counter() - started > budget_s:
                break
            for rows in buckets:
                for fmt, run in passes.items():
                    began = time.perf_counter()
                    run(rows)
                    samples[fmt][rows].append(time.perf_counter() - began)
    timings = {
        fmt: {rows: statistics.median(v) * 1e3 for rows, v in by_rows.items()} for fmt, by_rows in samples.items()
    }
    chosen = {rows: min(passes, key=lambda fmt: timings[fmt][rows]) for rows in buckets}
    choice = FormatChoice(chosen, timings, layers)
    log.info("weight formats: %s", choice.describe())
    others = contention.others_share(before, contention.snapshot())
    settled = others is None or others <= QUIET_SHARE
    if not settled:
        log.info("other processes used %.0f %% of the CPUs while the formats were measured: this choice is used "
                 "now and measured again at the next start", 100 * others)  # fmt: skip
    _remember(key, choice, settled)
    return choice


ROUNDS = 7
MEASURE_BUDGET_S = 3.0  # rounds stop once this is spent (the load waits for it)
# a measurement while other processes held more than this share of the CPUs is not kept as settled: timings under
# load once picked a float32+bfloat16 mix that ran one chat at 0.65x, remembered for good
QUIET_SHARE = 0.25
KEEP_DAYS = 60  # a settled choice is measured again after this (drivers, firmware and the machine's load change)


def remembered(key: str, formats: Sequence[str], buckets: Sequence[int] = BUCKETS) -> FormatChoice | None:
    """The settled choice remembered for this key among these formats, if any (nothing is measured): one measured
    on a quiet machine, less than KEEP_DAYS ago."""
    return _remembered(key, dict.fromkeys(formats), buckets)


def forced(env: str, allowed: Sequence[str] = ("never", "always")) -> str:
    """A measurement's override from the environment variable `env`: one of `allowed`, or "" (measure). A value that
    means nothing is warned about and measured, wherever the route could or could not run."""
    value = os.environ.get(env, "").strip().lower()
    if value and value not in allowed:
        log.warning("%s=%r is not %s: measured instead", env, value, " or ".join(repr(a) for a in allowed))
        return ""
    return value


def machine_key(*parts: object) -> str:
    """What a measured choice depends on: the CPU, torch and its threads, and the caller's parts (shapes...)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    text = json.dumps([cpu, torch.__version__, torch.get_num_threads(), *map(str, parts)])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _store() -> Path:
    return cache_dir() / "weight-formats.json"


def _remembered(key: str | None, passes: dict, buckets: Sequence[int]) -> FormatChoice | None:
    if key is None:
        return None
    entry = remembered_.recent(_store(), key, "measured_at", KEEP_DAYS, _now())
    if entry is None or entry.get("settled") is not True:
        return None  # measured under load, or by a version that did not say: measured again
    chosen = {int(rows): fmt for rows, fmt in entry.get("chosen", {}).items()}
    if set(chosen) != set(buckets) or not set(chosen.values()) <= set(passes):
        return None
    timings = {fmt: {int(r): float(v) for r, v in t.items()} for fmt, t in entry.get("timings", {}).items()}
    return FormatChoice(chosen, timings, str(entry.get("measured_on", "")))


def _now() -> float:
    return remembered_.now()  # tests replace this module's clock


def _remember(key: str | None, choice: FormatChoice, settled: bool) -> None:
    if key is None:
        return
    entry = {
        "chosen": choice.chosen,
        "timings": choice.timings_ms,
        "measured_on": choice.measured_on,
        "measured_at": _now(),
        "settled": settled,
    }
    remembered_.put(_store(), key, entry)
