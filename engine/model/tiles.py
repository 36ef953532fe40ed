"""From how many rows a compiled step multiplies int4/int8 weights as bfloat16 tiles instead of torch's weight-only
kernels: measured at load on the model's own largest weight of each kind, within a fixed budget, and remembered per
machine and shape (engine/model/csrc/decode_step.cpp has both routes; torch's kernels cost the same per row however
many rows share a weight, the tiles convert each weight once per step)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import NamedTuple

import torch

from engine.model import formats as formats_
from engine.model import int4pack, quantized

log = logging.getLogger(__name__)

BUCKETS = (2, 4, 8, 16)  # decode rows: one chat is torch's kernel's; a step of 64 rows or more runs Python's tiles
# int8 activations are measured at one row too: a weight read once (one chat) streams faster through them on some
# shapes; and up to 64 rows: a step of a few chats' decode rows plus a prompt's chunk (17-63 rows) runs compiled, where
# torch's kernels cost as much per row as alone (a 22016x2048 int4 weight at 48 rows on 2 Zen cores: 13.4 ms against
# int8 activations' 4.9)
ACTIVATION_BUCKETS = (1, *BUCKETS, 32, 64)
KERNEL, TILES = "kernel", "tiles"
MEASURE_BUDGET_S = 0.6  # per kind: the load waits for it (later loads read the remembered choice)
#: weights smaller than this stay on torch's kernels unmeasured: the tiles pay off only where a weight outgrows the
#: caches (and tiny test models then choose alike on every machine)
MIN_WEIGHTS = 1 << 20
VERSION = 4  # of the tiles' kernels in decode_step.cpp: a choice measured on an older one is measured again
ENV = "INFERENCE_STUDIO_TILES"  # "never" or "always" instead of the measurement (a user's override, tests)
# int4 and int8 weights times int8 activations (VNNI dot products, or AMX tiles: the same floats), for steps of a few
# rows: measured against the route that runs there
OTHERS, VNNI, AMX = "kernel or tiles", "int8 activations", "int8 activations (AMX)"
VNNI_VERSION = 5  # of int4_vnni_mm, int4_amx_mm, int8_vnni_mm and int8_amx_mm, and the buckets they are measured at
#: "never", "always" (VNNI dot products) or "amx" (AMX tiles where the CPU has them) instead of the measurement
VNNI_ENV = "INFERENCE_STUDIO_VNNI"


class Int8Activations(NamedTuple):
    """The rows (first..last; 0: never) for which int4 weights multiply int8 activations, and from which of them
    with AMX tiles (0: VNNI dot products throughout)."""

    first: int
    last: int
    amx_from: int = 0


NEVER = Int8Activations(0, 0)


def tiles_from(kind: str, a: torch.Tensor, b: torch.Tensor, progress: Callable[[str], None] | None = None) -> int:
    """The fewest rows from which tiles beat torch's kernel for this weight (int4: packed, scales_and_zeros; int8: q,
    scale) at every measured bucket up to BUCKETS' last (and beyond: the gap only grows with rows); 0 for never.
    progress: told when a measurement runs (the first load on this machine and kernel; later ones remember it)."""
    forced = formats_.forced(ENV)
    if forced:
        return BUCKETS[0] if forced == "always" else 0
    in_features = a.shape[1] * 2 if kind == "int4" else a.shape[1]  # int4: two codes a byte
    if a.shape[0] * in_features < MIN_WEIGHTS or (kind == "int4" and int4pack.layout() is None):
        return 0
    key = formats_.machine_key("tiles", VERSION, kind, tuple(a.shape), quantized.tiles_vnni())
    if progress is not None and formats_.remembered(key, (KERNEL, TILES), BUCKETS) is None:
        progress(f"measuring {kind} products: torch's kernel against bfloat16 tiles (once on this machine)")
    choice = formats_.measure(_passes(kind, a, b, in_features), buckets=BUCKETS, key=key, budget_s=MEASURE_BUDGET_S)
    start = _start_of_winning_tail(choice, TILES, BUCKETS, BUCKETS)  # up to the last bucket (the gap only grows)
    log.info("%s weights %s: tiles from %s rows (%s)", kind, tuple(a.shape), start or "no", choice.describe())
    return start


def vnni_rows(
    a: torch.Tensor, b: torch.Tensor, tiles_start: int, progress: Callable[[str], None] | None = None
) -> Int8Activations:
    """For an int4 weight (packed, scales_and_zeros): the rows for which int8 activations (decode_step.cpp's
    int4_vnni_mm, or int4_amx_mm where the CPU has AMX) beat what runs there otherwise (torch's kernel below
    tiles_start, the tiles from it): the longest run of measured buckets they win, AMX from where it wins to the end
    of that run; NEVER where this build has no VNNI products."""
    layout = int4pack.layout()
    if layout is None or not torch.ops.studio.int4_vnni():
        vnni_forced()  # a meaningless value is warned about even where the routes cannot run
        return NEVER
    scales = b.contiguous()
    return _int8_activation_rows(
        "int4", a, b, a.shape[1] * 2, a.shape[0] * a.shape[1] * 2, tiles_start, progress,
        vnni=lambda x: torch.ops.studio.int4_vnni_mm(x, a, scales, layout.block, layout.split),
        amx=lambda x: torch.ops.studio.int4_amx_mm(x, a, scales, layout.block, layout.split),
    )  # fmt: skip


def int8_rows(
    q: torch.Tensor, scale: torch.Tensor, tiles_start: int, progress: Callable[[str], None] | None = None
) -> Int8Activations:
    """For an int8 weight (q, scale): the rows for which int8 activations (decode_step.cpp's int8_vnni_mm, or
    int8_amx_mm where the CPU has AMX: the same floats) beat what runs there otherwise, as vnni_rows measures them;
    NEVER where rows are not groups of 32 inputs, or the build has no VNNI products (AMX builds have them)."""
    if q.shape[1] % 32 or not torch.ops.studio.int4_vnni():
        vnni_forced()  # a meaningless value is warned about even where the routes cannot run
        return NEVER
    return _int8_activation_rows(
        "int8", q, scale, q.shape[1], q.numel(), tiles_start, progress,
        vnni=lambda x: torch.ops.studio.int8_vnni_mm(x, q, scale),
        amx=lambda x: torch.ops.studio.int8_amx_mm(x, q, scale),
    )  # fmt: skip


def vnni_forced() -> str:
    """INFERENCE_STUDIO_VNNI as the int8-activation routes and the LM head read it: "never", "always", "amx", or ""
    (measured; a value that means nothing is warned about and measured too)."""
    return formats_.forced(VNNI_ENV, ("never", "always", "amx"))


def _int8_activation_rows(
    kind: str,
    a: torch.Tensor,
    b: torch.Tensor,
    width: int,
    weights: int,
    tiles_start: int,
    progress: Callable[[str], None] | None,
    vnni: Callable[[torch.Tensor], torch.Tensor],
    amx: Callable[[torch.Tensor], torch.Tensor],
) -> Int8Activations:
    """The rows for which a weight of `kind` ("int4", "int8") multiplies int8 activations: forced, or measured against
    the route that runs there otherwise (remembered per machine and shape)."""
    forced = vnni_forced()
    if forced == "never":
        return NEVER
    has_amx = bool(torch.ops.studio.int4_amx())
    first, last = ACTIVATION_BUCKETS[0], ACTIVATION_BUCKETS[-1]
    if forced == "amx" and has_amx:
        return Int8Activations(first, last, first)
    if forced in ("always", "amx"):
        return Int8Activations(first, last, 0)
    if weights < MIN_WEIGHTS:
        return NEVER
    routes = (OTHERS, VNNI, AMX) if has_amx else (OTHERS, VNNI)
    key = formats_.machine_key(f"{kind} vnni", VNNI_VERSION, tuple(a.shape), tiles_start, quantized.tiles_vnni(),
                               has_amx)  # fmt: skip
    if progress is not None and formats_.remembered(key, routes, ACTIVATION_BUCKETS) is None:
        progress(f"measuring {kind} products: int8 activations against the bfloat16 tiles (once on this machine)")
    others = _passes(kind, a, b, width, ACTIVATION_BUCKETS)
    inputs = {rows: torch.randn(rows, width).to(torch.bfloat16) for rows in ACTIVATION_BUCKETS}
    passes = {
        OTHERS: lambda rows: others[TILES if 0 < tiles_start <= rows else KERNEL](rows),
        VNNI: lambda rows: vnni(inputs[rows]),
        AMX: lambda rows: amx(inputs[rows]),
    }
    choice = formats_.measure({route: passes[route] for route in routes}, buckets=ACTIVATION_BUCKETS, key=key,
                              budget_s=MEASURE_BUDGET_S)  # fmt: skip
    best = _longest_run(choice, (VNNI, AMX), ACTIVATION_BUCKETS)
    if not best:
        log.info("%s weights %s: no int8 activations (%s)", kind, tuple(a.shape), choice.describe())
        return NEVER
    found = Int8Activations(_first_row(best[0], ACTIVATION_BUCKETS), best[-1], 0)
    # AMX from the first of the AMX buckets that end the run
    found = found._replace(amx_from=_start_of_winning_tail(choice, AMX, tuple(best), ACTIVATION_BUCKETS))
    log.info("%s weights %s: int8 activations for %s-%s rows%s (%s)", kind, tuple(a.shape), found.first, found.last,
             f", AMX tiles from {found.amx_from}" if found.amx_from else "", choice.describe())  # fmt: skip
    return found


def _longest_run(choice: formats_.FormatChoice, winners: tuple[str, ...], buckets: tuple[int, ...]) -> list[int]:
    """The longest run of adjacent buckets where one of `winners` was measured fastest (of equals, the first)."""
    runs: list[list[int]] = []
    for rows in buckets:
        if choice.chosen[rows] in winners:
            if runs and runs[-1][-1] == buckets[buckets.index(rows) - 1]:
                runs[-1].append(rows)
            else:
                runs.append([rows])
    return max(runs, key=len, default=[])


def _first_row(bucket: int, buckets: tuple[int, ...]) -> int:
    """The first row a bucket holds: the one above the bucket below it (the first bucket holds its own)."""
    index = buckets.index(bucket)
    return buckets[0] if index == 0 else buckets[index - 1] + 1


def _start_of_winning_tail(choice, winner: str, run: tuple[int, ...], buckets: tuple[int, ...]) -> int:
    """The first row of the buckets that end `run` (adjacent buckets) where `winner` was measured fastest; 0 where
    it lost the last."""
    tail = list(itertools.takewhile(lambda rows: choice.chosen[rows] == winner, reversed(run)))
    return _first_row(tail[-1], buckets) if tail else 0


def _passes(kind: str, a: torch.Tensor, b: torch.Tensor, in_features: int, buckets: tuple[int, ...] = BUCKETS) -> dict:
    """Both routes on this weight, as the model's steps call them."""
    inputs = {rows: torch.randn(rows, in_features).to(torch.bfloat16) for rows in buckets}
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
