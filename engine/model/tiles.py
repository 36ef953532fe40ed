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
# int4 weights times int8 activations (VNNI), for steps of a few rows: measured against the route that runs there
OTHERS, VNNI = "kernel or tiles", "int8 activations"
VNNI_VERSION = 1  # of int4_vnni_mm
VNNI_ENV = "INFERENCE_STUDIO_VNNI"  # "never" or "always" instead of the measurement


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
    start = _first_of_winning_run(choice, TILES)
    log.info("%s weights %s: tiles from %s rows (%s)", kind, tuple(a.shape), start or "no", choice.describe())
    return start


def vnni_rows(
    a: torch.Tensor, b: torch.Tensor, tiles_start: int, progress: Callable[[str], None] | None = None
) -> tuple[int, int]:
    """For an int4 weight (packed, scales_and_zeros): the rows (first, last) for which int8 activations with VNNI
    dot products (decode_step.cpp's int4_vnni_mm) beat what runs there otherwise (torch's kernel below tiles_start,
    the tiles from it): the longest run of measured buckets they win; (0, 0) for none, or where this build has no
    VNNI products."""
    forced = os.environ.get(VNNI_ENV, "").strip().lower()
    if forced not in ("", "never", "always"):
        log.warning("%s=%r is not 'never' or 'always': measured instead", VNNI_ENV, forced)
    if forced == "never" or int4pack.layout() is None or not torch.ops.studio.int4_vnni():
        return 0, 0
    if forced == "always":
        return BUCKETS[0], BUCKETS[-1]
    if a.shape[0] * a.shape[1] * 2 < MIN_WEIGHTS:
        return 0, 0
    key = formats_.machine_key("int4 vnni", VNNI_VERSION, tuple(a.shape), tiles_start, quantized.tiles_vnni())
    if progress is not None and formats_.remembered(key, (OTHERS, VNNI), BUCKETS) is None:
        progress("measuring int4 products: int8 activations (VNNI) against the bfloat16 tiles (once on this machine)")
    others = _passes("int4", a, b, a.shape[1] * 2)
    inputs = {rows: torch.randn(rows, a.shape[1] * 2).to(torch.bfloat16) for rows in BUCKETS}
    scales, layout = b.contiguous(), int4pack.layout()
    passes = {
        OTHERS: lambda rows: others[TILES if 0 < tiles_start <= rows else KERNEL](rows),
        VNNI: lambda rows: torch.ops.studio.int4_vnni_mm(inputs[rows], a, scales, layout.block, layout.split),
    }
    choice = formats_.measure(passes, buckets=BUCKETS, key=key, budget_s=MEASURE_BUDGET_S)
    runs: list[list[int]] = []
    for rows in BUCKETS:
        if choice.chosen[rows] == VNNI:
            if runs and runs[-1][-1] == BUCKETS[BUCKETS.index(rows) - 1]:
                runs[-1].append(rows)
            else:
                runs.append([rows])
    best = max(runs, key=len, default=[])  # the longest; of equals, the first
    first = 0 if not best else BUCKETS[0] if best[0] == BUCKETS[0] else BUCKETS[BUCKETS.index(best[0]) - 1] + 1
    found = (first, best[-1]) if best else (0, 0)
    log.info("int4 weights %s: int8 activations for %s rows (%s)", tuple(a.shape),
             f"{found[0]}-{found[1]}" if best else "no", choice.describe())  # fmt: skip
    return found


def _first_of_winning_run(choice, winner: str) -> int:
    """The first row of the longest run of buckets, up to BUCKETS' last, where `winner` was measured fastest (a bucket
    holds the rows above the one below it; the first, its own); 0 where it lost the last."""
    start = 0
    lower = dict(zip(BUCKETS[1:], BUCKETS[:-1], strict=True))
    for rows in sorted(BUCKETS, reverse=True):
        if choice.chosen[rows] != winner:
            break
        start = lower.get(rows, rows - 1) + 1
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
