"""Whether this machine holds bfloat16 weight copies in the compiled library's blocks (decode_step.cpp's
bf16_blocks_mm: 16 rows a block, column pairs side by side, rows claimed by the threads) instead of oneDNN's packing:
measured once per machine on a set of weights larger than the caches, within a fixed budget, and remembered."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine.model import formats as formats_

log = logging.getLogger(__name__)

ONEDNN, BLOCKS = "oneDNN packing", "bfloat16 blocks"
BUCKETS = (1, 16, 64)  # one chat; sixteen; a prompt's chunk
#: the blocks are taken where they need at most WIN of oneDNN's time at one row (what one chat waits on) and at most
#: GIVE of it at 16 and 64 rows: in one process on 2 Zen 5 cores, the embedded model's copy in blocks streamed `single`
#: 1.18x, `chat4` 1.08x and `chat16` 1.02x as fast as in oneDNN's packing, where this measurement put the blocks 7 %
#: behind at 16 rows
WIN, GIVE = 0.95, 1.10
#: the gate/up and down matrices of the small models a bfloat16 copy is made for (float32 under 1 GiB: SmolLM2-135M's
#: 576 wide, -360M's 960)
SHAPES = ((3072, 576), (576, 1536), (5120, 960), (960, 2560))
COPIES = 6  # of each: 118 MB, past any CPU's caches, as a step reads its weights
MEASURE_BUDGET_S = 1.0
VERSION = 3  # of bf16_blocks_mm and this measurement: a choice measured on an older one is measured again
ENV = "INFERENCE_STUDIO_BF16_BLOCKS"  # "never" or "always" instead of the measurement (a user's override, tests)


_decided: dict[str, bool] = {}  # by ENV's value: a process decides once (a model's copies make ~100 linears)


def use_blocks(progress: Callable[[str], None] | None = None) -> bool:
    """Whether bfloat16 copies are held as blocks here: where the library is built with bfloat16 dot products and
    measured faster, or forced by ENV (the library loaded). progress: told when it is measured (once a machine)."""
    forced = formats_.forced(ENV)
    if forced not in _decided:
        _decided[forced] = _decide(forced, progress)
    return _decided[forced]


def _decide(forced: str, progress: Callable[[str], None] | None) -> bool:
    if forced == "never":
        return False
    from engine.model import compiled_step  # the library: built once per machine (it imports this module's caller)

    if not compiled_step.ensure_loaded():
        return False
    if forced == "always":
        return True
    if not torch.ops.studio.bf16_blocks_built():
        return False
    key = formats_.machine_key("bf16 blocks", VERSION, SHAPES, COPIES)
    choice = formats_.remembered(key, (ONEDNN, BLOCKS), BUCKETS)  # before the passes: they make 118 MB of weights
    if choice is None:
        if progress is not None:
            progress("measuring bfloat16 layouts: oneDNN's packing against blocks (once on this machine)")
        choice = formats_.measure(_passes(), buckets=BUCKETS, key=key, budget_s=MEASURE_BUDGET_S)
    chosen = wins(choice)
    log.info("bfloat16 copies held as %s (%s)", BLOCKS if chosen else ONEDNN, choice.describe())
    return chosen


def wins(choice: formats_.FormatChoice) -> bool:
    """The blocks win one row by WIN and give at most GIVE at the other buckets."""
    times = choice.timings_ms
    if BLOCKS not in times or ONEDNN not in times:
        return choice.format_for(BUCKETS[0]) == BLOCKS
    first, *others = BUCKETS
    return times[BLOCKS][first] <= WIN * times[ONEDNN][first] and all(
        times[BLOCKS][rows] <= GIVE * times[ONEDNN][rows] for rows in others
    )


def _passes() -> dict:
    weights = [torch.randn(rows, width).bfloat16() for rows, width in SHAPES for _ in range(COPIES)]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, 16) for w in weights]
    blocks = [torch.ops.studio.bf16_blocks(w) for w in weights]
    inputs = {width: torch.randn(BUCKETS[-1], width).bfloat16() for _rows, width in SHAPES}

    def onednn(rows: int) -> None:
        for w, p in zip(weights, packed, strict=True):
            torch.ops.mkldnn._linear_pointwise(inputs[w.shape[1]][:rows], p, None, "none", [], "").float()

    def blocked(rows: int) -> None:
        for w, b in zip(weights, blocks, strict=True):
            torch.ops.studio.bf16_blocks_mm(inputs[w.shape[1]][:rows], b)

    return {ONEDNN: onednn, BLOCKS: blocked}
