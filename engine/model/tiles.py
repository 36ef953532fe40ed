"""From how many rows a compiled step multiplies int4/int8 weights as bfloat16 tiles instead of torch's weight-only
kernels: measured at load on the model's own largest weight of each kind, within a fixed budget, and remembered per
machine and shape (engine/model/csrc/decode_step.cpp has both routes; torch's kernels cost the same per row however
many rows share a weight, the tiles convert each weight once per step)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from engine.model import formats as formats_
from engine.model import int4pack, quantized

log = logging.getLogger(__name__)

BUCKETS = (2, 4, 8, 16)  # decode rows: one chat is torch's kernel's; a step of 64 rows or more runs Python's tiles
KERNEL, TILES = "kernel", "tiles"
MEASURE_BUDGET_S = 0.6  # per kind: the load waits for it (later loads read the remembered choice)
#: weights smaller than this stay on torch's kernels unmeasured: the tiles pay off only where a weight outgrows the
#: caches (and tiny test models then choose alike on every machine)
MIN_WEIGHTS = 1 << 20
VERSION = 4  # of the tiles' kernels in decode_step.cpp: a choice measured on an older one is measured again
ENV = "INFERENCE_STUDIO_TILES"  # "never" or "always" instead of the measurement (a user's override, tests)


def tiles_from(kind: str, a: torch.Tensor, b: torch.Tensor, progress: Callable[[str], None] | None = None) -> int:
    """The fewest rows from which tiles beat torch's kernel for this weight (int4: packed, scales_and_zeros; int8: q,
    scale) at every measured bucket up to BUCKETS' last (and beyond: the gap only grows with rows); 0 for never.
    progress: told when a measurement runs (the first load on this machine and kernel; later ones remember it)."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("never", "always"):
        return BUCKETS[0] if forced == "always" else 0
    if forced:
        log.warning("%s=%r is not 'never' or 'always': measured instead", ENV, forced)
    in_features = a.shape[1] * 2 if kind == "int4" else a.shape[1]  # int4: two codes a byte
    if a.shape[0] * in_features < MIN_WEIGHTS or (kind == "int4" and int4pack.layout() is None):
        return 0
    key = formats_.machine_key("tiles", VERSION, kind, tuple(a.shape), quantized.tiles_vnni())
    if progress is not None and formats_.remembered(key, (KERNEL, TILES), BUCKETS) is None:
        progress(f"measuring {kind} products: torch's kernel against bfloat16 tiles (once on this machine)")
    choice = formats_.measure(_passes(kind, a, b, in_features), buckets=BUCKETS, key=key, budget_s=MEASURE_BUDGET_S)
    start = 0
    lower = dict(zip(BUCKETS[1:], BUCKETS[:-1], strict=True))
    for rows in sorted(BUCKETS, reverse=True):  # the longest run of buckets up to the last where tiles win
        if choice.chosen[rows] != TILES:
            break
        start = lower.get(rows, rows - 1) + 1  # a bucket holds the rows above the one below it (the first: its own)
    log.info("%s weights %s: tiles from %s rows (%s)", kind, tuple(a.shape), start or "no", choice.describe())
    return start


def _passes(kind: str, a: torch.Tensor, b: torch.Tensor, in_features: int) -> dict:
    """Both routes on this weight, as the model's steps call them."""
    inputs = {rows: torch.randn(rows, in_features).to(torch.bfloat16) for rows in BUCKETS}
    if kind == "int4":
        scales = b.contiguous()
        return {
            KERNEL: lambda rows: quantized.int4_kernel_mm(inputs[rows], a, scales),
            TILES: lambda rows: quantized.int4_tiles_mm(inputs[rows], a, scales),
        }
    return {
        KERNEL: lambda rows: torch._weight_int8pack_mm(inputs[rows], a, b),
        TILES: lambda rows: quantized.int8_tiles_mm(inputs[rows], a, b),
    }
