"""The KV cache's dtype: a 16-bit model keeps its own; a model held as stored (float32 activations around int4/int8
weights) gets bfloat16 KV on a CPU (half the bytes per token: twice the chats in the same budget) where the paged
attention takes float32 queries over 16-bit pages, checked once here; float32 stays with `--dtype float32`, the
token-exact reference."""

from __future__ import annotations

import functools

import torch

AS_STORED_KV = torch.bfloat16
MINIMUM_TOKENS = 4096  # the smallest KV cache worth loading a model for: one long chat
#: the automatic budget: as many tokens as llama.cpp's server holds by default (4 slots of 4096), so the same chats fit
DEFAULT_TOKENS = 16384
FREE_SHARE = 0.5  # of the memory left free after the model: the rest stays for the system and other programs


def minimum_budget(kv_bytes_per_token: int) -> int:
    return MINIMUM_TOKENS * kv_bytes_per_token


def default_budget(kv_bytes_per_token: int, free_bytes: int) -> int:
    """The automatic KV budget: DEFAULT_TOKENS of this model's KV (so it grows with the model's layers, heads and KV
    dtype), at most FREE_SHARE of the memory free beside the model, and never under one long chat (MINIMUM_TOKENS).
    free_bytes: the memory free with the model loaded (or, before loading, free memory minus the estimate)."""
    wanted = DEFAULT_TOKENS * kv_bytes_per_token
    if free_bytes > 0:
        wanted = min(wanted, int(free_bytes * FREE_SHARE))
    return max(wanted, minimum_budget(kv_bytes_per_token))


def describe_budget(budget: int, kv_bytes_per_token: int) -> str:
    from engine.load.estimate import format_bytes

    return f"{format_bytes(budget)} ({budget // max(1, kv_bytes_per_token):,} tokens)"


def kv_dtype(device: str, model_dtype: torch.dtype, as_stored: bool) -> torch.dtype:
    if not as_stored:
        return model_dtype
    if device == "cpu" and attention_takes(AS_STORED_KV):
        return AS_STORED_KV
    return torch.float32


@functools.cache
def attention_takes(kv: torch.dtype) -> bool:
    """Whether the paged attention runs float32 queries over a `kv` cache (a prefill chunk, then a decode row over
    the cached page) and agrees with a float32 cache to within kv's rounding."""
    results = [_probe(kv), _probe(torch.float32)]
    if results[0] is None or results[1] is None:
        return False
    return all(torch.allclose(a, b, atol=0.05, rtol=0.05) for a, b in zip(results[0], results[1], strict=True))


def _probe(kv: torch.dtype) -> list[torch.Tensor] | None:
    from engine.model.attention import PagedKVCache, PrefillSlice, StepContext, paged_attention

    generator = torch.Generator().manual_seed(0)
    cache = PagedKVCache(1, 1, 8, 2, 4, kv, "cpu")
    q, k, v = (torch.randn(4, h, 8, generator=generator) for h in (2, 1, 1))
    prefill = StepContext(cache, torch.arange(3), 0, None, None, 0, [PrefillSlice(0, 3, 3, None)])
    decode = StepContext(cache, torch.tensor([3]), 1, torch.tensor([0]), torch.tensor([4]), 1, [])
    try:
        with torch.inference_mode():
            first = paged_attention(prefill, 0, q[:3], k[:3], v[:3], 0.35)
            second = paged_attention(decode, 0, q[3:], k[3:], v[3:], 0.35)
    except (RuntimeError, TypeError):  # dtype mismatches inside the attention: it does not take this cache
        return None
    if first.dtype != torch.float32 or second.dtype != torch.float32:
        return None
    return [first, second]
