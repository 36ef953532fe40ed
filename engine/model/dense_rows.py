"""Up to how many rows a compiled step multiplies float32 and bfloat16 weights by its claimed dot products
(decode_step.cpp's dense_claimed_mm) instead of oneDNN's prepacked product (or at::linear, for weights not prepacked):
measured at load over the model's own weights, cold as a step reads them, within a fixed budget, and remembered per
machine and shape."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from engine.model import formats as formats_

log = logging.getLogger(__name__)

# decode rows: one chat, a chat with drafts, a few chats, many (plain 16-bit weights: at::linear loses up to 64 rows)
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
OTHERS, CLAIMED = "oneDNN prepacked or at::linear", "claimed dot products"
#: the claimed products take a bucket where they need at most this share of the others' time: on a bfloat16 0.5B model
#: a 3.5 % lead measured at 16 rows was a 4 % loss serving 16 chats (mixed steps, other weights in the caches)
MARGIN = 0.95
MEASURE_BUDGET_S = 1.0  # the load waits for it once per machine and shape (later loads read the remembered choice)
VERSION = 1  # of dense_claimed_mm: a choice measured on an older one is measured again
#: float32 weights that all together hold fewer values than this stay on oneDNN's / at::linear unmeasured: the claimed
#: products pay off where the weights stream from memory (and tiny test models then choose alike on every machine)
MIN_WEIGHTS = 1 << 22
ENV = "INFERENCE_STUDIO_CLAIMED"  # "never" or "always" instead of the measurement (a user's override, tests)


def claimed_to(
    weights: Sequence[tuple[torch.Tensor | None, torch.Tensor]], progress: Callable[[str], None] | None = None
) -> int:
    """weights: (prepacked or None, plain rows) of every float32 / bfloat16 linear the step runs. The most rows (a
    bucket) up to which the claimed products beat what runs there otherwise at every bucket from one row; 0 for never.
    progress: told when a measurement runs (the first load on this machine; later ones remember it)."""
    forced = formats_.forced(ENV)
    if forced:
        return BUCKETS[-1] if forced == "always" else 0
    if sum(plain.numel() for _packed, plain in weights) < MIN_WEIGHTS:
        return 0
    shapes = tuple(sorted({(packed is not None, str(plain.dtype), *plain.shape) for packed, plain in weights}))
    key = formats_.machine_key("claimed", VERSION, shapes, len(weights))
    if progress is not None and formats_.remembered(key, (OTHERS, CLAIMED), BUCKETS) is None:
        progress("measuring float products: oneDNN's against claimed dot products (once on this machine)")
    choice = formats_.measure(_passes(weights), buckets=BUCKETS, key=key, budget_s=MEASURE_BUDGET_S)
    rows = winning_run(choice)
    log.info("float weights: claimed dot products up to %s rows (%s)", rows or "no", choice.describe())
    return rows


def winning_run(choice: formats_.FormatChoice) -> int:
    """The last bucket of the run the claimed products win from the first bucket on by MARGIN (0: not the first)."""
    rows = 0
    for bucket in BUCKETS:
        times = choice.timings_ms
        if CLAIMED in times and OTHERS in times:
            wins = times[CLAIMED][bucket] <= MARGIN * times[OTHERS][bucket]
        else:
            wins = choice.format_for(bucket) == CLAIMED
        if not wins:
            break
        rows = bucket
    return rows


def _passes(weights: Sequence[tuple[torch.Tensor | None, torch.Tensor]]) -> dict[str, Callable[[int], None]]:
    """Each pass multiplies every weight once: the whole model's float32 weights outgrow the caches, as in a step."""
    inputs = {width: torch.randn(BUCKETS[-1], width) for width in {plain.shape[1] for _packed, plain in weights}}

    def others(rows: int) -> None:  # as the step runs them: the rows cast to the weight's dtype, float32 out
        for packed, plain in weights:
            x = inputs[plain.shape[1]][:rows].to(plain.dtype)
            if packed is None:
                torch.nn.functional.linear(x, plain).float()
            else:
                torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

    def claimed(rows: int) -> None:
        for _packed, plain in weights:
            torch.ops.studio.dense_claimed_mm(inputs[plain.shape[1]][:rows].to(plain.dtype), plain)

    return {OTHERS: others, CLAIMED: claimed}
