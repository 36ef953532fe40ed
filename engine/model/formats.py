"""Weight formats of the lean forward's linears, and the fastest one for each batch size, measured on this model's
own layers on this machine when it loads (bfloat16 GEMMs read half the bytes of float32 ones, which wins where
decode is bound by memory bandwidth, but loses to float32 on CPUs without bfloat16 instructions at larger batches)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.model import kernels
from engine.model.quantized import Int4Linear, Int8Linear

log = logging.getLogger(__name__)

FLOAT32, BFLOAT16, INT8, INT4 = "float32", "bfloat16", "int8", "int4"
BUCKETS = (1, 4, 16, 64)  # rows a step multiplies: a few decode rows ... many rows or a prefill chunk
DTYPES = {FLOAT32: torch.float32, BFLOAT16: torch.bfloat16}
QUANTIZED = {INT8: Int8Linear, INT4: Int4Linear}


class FormattedLinear(nn.Module):
    """A float32 linear computed in another weight format: inputs cast to it, outputs back to float32, the bias
    added in float32. Prepacked for oneDNN on CPU."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fmt: str) -> None:
        super().__init__()
        self.dtype = DTYPES[fmt]
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(self.dtype).contiguous(), 16)
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(self.dtype)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, None, "none", [], "").float()
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)


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
        with torch.inference_mode():
            out = make_linear(weight, None, fmt)(x)
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
        return f"{spans} (measured ms per pass at {'/'.join(map(str, sorted(self.chosen)))} rows: {ms})"


def single(fmt: str) -> FormatChoice:
    return FormatChoice({bucket: fmt for bucket in BUCKETS})


def measure(passes: dict[str, Callable[[int], None]], buckets: Sequence[int] = BUCKETS) -> FormatChoice:
    """passes[format](rows) runs every linear of the model once on `rows` rows; the fastest format per bucket wins
    (the best of five timed runs after a warm-up, so a busy moment of a shared machine does not decide)."""
    timings: dict[str, dict[int, float]] = {fmt: {} for fmt in passes}
    with torch.inference_mode():
        for rows in buckets:
            for fmt, run in passes.items():
                run(rows)
                samples = []
                for _ in range(5):
                    started = time.perf_counter()
                    run(rows)
                    samples.append(time.perf_counter() - started)
                timings[fmt][rows] = min(samples) * 1e3
    chosen = {rows: min(passes, key=lambda fmt: timings[fmt][rows]) for rows in buckets}
    choice = FormatChoice(chosen, timings)
    log.info("weight formats: %s", choice.describe())
    return choice
