"""Batched sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, per-request seeds."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.core.request import Request
from engine.types import SamplingParams


def apply_repetition_penalty(logits: torch.Tensor, previous: Sequence[int], penalty: float) -> torch.Tensor:
    """As in transformers: positive logits of seen tokens divided by the penalty, negative ones multiplied."""
    if penalty == 1.0 or not previous:
        return logits
    index = torch.tensor(sorted(set(previous)), dtype=torch.long, device=logits.device)
    seen = logits.gather(-1, index)
    logits = logits.clone()
    logits.scatter_(-1, index, torch.where(seen > 0, seen / penalty, seen * penalty))
    return logits


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p on one row; filtered-out tokens become -inf."""
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (the top one always stays)
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if params.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return logits


def ban_end_tokens(logits: torch.Tensor, requests: Sequence[Request], eos_ids: set[int]) -> torch.Tensor:
    """Rows whose request has not reached its min_tokens cannot end: EOS and its stop tokens get -inf (vLLM's
    min_tokens; what transformers' min_new_tokens and llama.cpp's ignore_eos do)."""
    rows: list[int] = []
    cols: list[int] = []
    for row, request in enumerate(requests):
        if len(request.output_ids) < request.params.min_tokens:
            vocab = logits.shape[-1]
            banned = [t for t in eos_ids | set(request.params.stop_token_ids) if 0 <= t < vocab]
            rows.extend([row] * len(banned))
            cols.extend(banned)
    if rows:
        logits = logits.clone()
        logits[rows, cols] = float("-inf")
    return logits


class Sampler:
    def __init__(self, seed: int | None = None, eos_ids: set[int] | None = None) -> None:
        self.eos_ids: set[int] = set(eos_ids or ())
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()

    def sample(self, logits: torch.Tensor, requests: Sequence[Request]) -> list[int]:
        """One next token per row of logits [rows, vocab] (float32, on any device)."""
        logits = ban_end_tokens(logits, requests, self.eos_ids)
        if all(r.params.greedy and r.params.repetition_penalty == 1.0 for r in requests):
            return logits.argmax(dim=-1).tolist()
        logits = logits.cpu()
        chosen: list[int] = []
        for row, request in zip(logits, requests, strict=True):
            params = request.params
            row = apply_repetition_penalty(row, request.all_ids, params.repetition_penalty)
            if params.greedy:
                chosen.append(int(row.argmax()))
                continue
            probs = torch.softmax(filter_logits(row, params), dim=-1)
            generator = request.generator or self.generator
            chosen.append(int(torch.multinomial(probs, 1, generator=generator)))
        return chosen
