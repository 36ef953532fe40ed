"""Batched sampling: greedy, temperature, top-k, top-p, min-p, repetition, presence and frequency penalties,
per-request seeds."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.model.step_plan import SamplingRow
from engine.types import Alternative, SamplingParams, TokenLogprob


def apply_repetition_penalty(logits: torch.Tensor, previous: Sequence[int], penalty: float) -> torch.Tensor:
    """As in transformers: positive logits of seen tokens divided by the penalty, negative ones multiplied."""
    if penalty == 1.0 or not previous:
        return logits
    index = torch.tensor(sorted(set(previous)), dtype=torch.long, device=logits.device)
    seen = logits.gather(-1, index)
    logits = logits.clone()
    logits.scatter_(-1, index, torch.where(seen > 0, seen / penalty, seen * penalty))
    return logits


def apply_penalties(logits: torch.Tensor, sampled: SamplingRow) -> torch.Tensor:
    """A request's penalties on one row, as vLLM applies them: the repetition penalty over the prompt and the reply
    (transformers' rule), then OpenAI's presence and frequency penalties over the reply's tokens:
    logit -= frequency_penalty * count + presence_penalty * (count > 0)."""
    params = sampled.params
    logits = apply_repetition_penalty(logits, sampled.seen, params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and sampled.output:
        ids, counts = torch.tensor(sampled.output, dtype=torch.long).unique(return_counts=True)
        ids = ids.to(logits.device)
        drop = counts.to(logits.device, logits.dtype) * params.frequency_penalty + params.presence_penalty
        logits = logits.index_add(-1, ids, -drop)  # a new tensor: the caller's row stays as it was
    return logits


def penalized_ids(sampled: SamplingRow) -> list[int]:
    """The tokens whose logits the request's penalties change (sorted): every earlier token for the repetition
    penalty, the reply's own for presence and frequency (its draft's too)."""
    params = sampled.params
    if params.repetition_penalty != 1.0:
        return sorted(set(sampled.seen) | set(sampled.draft))
    if params.presence_penalty or params.frequency_penalty:
        return sorted(set(sampled.output) | set(sampled.draft))
    return []


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p on one row; filtered-out tokens become -inf."""
    ids, kept = candidates(logits, params)
    if ids is None:
        return kept
    return torch.full_like(logits, float("-inf")).scatter_(-1, ids, kept)


def candidates(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor | None, torch.Tensor]:
    """filter_logits' result as (token ids in ascending order, their logits) when top-k leaves a few: top-p and min-p
    then work on those k values rather than sorting the whole vocabulary (a few ms a token on a CPU). Without top-k:
    (None, the whole filtered row). Drawing by inverse CDF over the ids in ascending order picks the token the whole
    row would."""
    logits = logits / params.temperature
    ids = None
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        ids = (logits >= kth).nonzero().squeeze(-1)  # ties with the k-th stay, as a mask would keep them
        logits = logits[ids]
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (the top one always stays)
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= params.top_p
        drop_sorted[..., 0] = False  # even where top_p rounds to 0 in float32 (5e-324): all -inf sampled garbage
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if params.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return ids, logits


def ban_end_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], made: Sequence[int], eos_ids: set[int]
) -> torch.Tensor:
    """Rows whose request has made fewer than its min_tokens (`made` and `params` per row) cannot end: EOS and its
    stop tokens get -inf (vLLM's min_tokens; what transformers' min_new_tokens and llama.cpp's ignore_eos do)."""
    rows: list[int] = []
    cols: list[int] = []
    vocab = logits.shape[-1]
    for row, (row_params, count) in enumerate(zip(params, made, strict=True)):
        if count < row_params.min_tokens:
            banned = [t for t in eos_ids | set(row_params.stop_token_ids) if 0 <= t < vocab]
            rows.extend([row] * len(banned))
            cols.extend(banned)
    if rows:
        logits = logits.clone()
        logits[rows, cols] = float("-inf")
    return logits


@torch.inference_mode()  # the runner's logits are inference tensors: changed in place only in inference mode
def apply_constraints(
    logits: torch.Tensor, requests: Sequence[SamplingRow], in_place: bool = False, grammar_applied: bool = False
) -> torch.Tensor:
    """Each row's logit bias, and its grammar's mask (tokens the grammar does not allow next get -inf). in_place:
    the caller does not need the raw logits any more (no request of the step asked for logprobs), so no copy;
    grammar_applied: the LM head already gave the disallowed tokens -inf (model/lm_head.py)."""
    biased = [i for i, r in enumerate(requests) if r.params.logit_bias]
    grammar = [] if grammar_applied else [i for i, r in enumerate(requests) if r.matcher is not None]
    if not biased and not grammar:
        return logits
    if not in_place:
        logits = logits.clone()
    for row in biased:
        ids, values = zip(*requests[row].params.logit_bias, strict=True)
        index = torch.tensor(ids, dtype=torch.long, device=logits.device)
        logits[row].index_add_(0, index, torch.tensor(values, dtype=logits.dtype, device=logits.device))
    if grammar:
        # one stacked mask and one fill for all constrained rows (a fill per row cost more than the grammar itself)
        allowed = torch.stack([requests[row].matcher.allowed() for row in grammar]).to(logits.device)
        rows = torch.tensor(grammar, dtype=torch.long, device=logits.device)
        logits[rows] = logits[rows].masked_fill_(~allowed, float("-inf"))
    return logits


def token_logprobs(
    logits: torch.Tensor,
    requests: Sequence[SamplingRow],
    tokens: Sequence[Sequence[int]],
    text: Callable[[int], str],
) -> list[list[TokenLogprob] | None]:
    """Raw log probabilities (the model's own, before sampling settings, bias and grammar, as vLLM's default) of
    each request's new tokens, with their top alternatives; None for requests that did not ask. The logits hold
    1 + len(draft) rows per request, as the sampler reads them: a request's j-th new token comes from its j-th row
    (the row after its last known token, then one after each draft token). text(token id) names a token."""
    out: list[list[TokenLogprob] | None] = []
    first_row = 0
    for request, new in zip(requests, tokens, strict=True):
        rows, first_row = range(first_row, first_row + len(new)), first_row + request.rows
        count = request.params.logprobs
        if count is None:
            out.append(None)
            continue
        items: list[TokenLogprob] = []
        for row, chosen in zip(rows, new, strict=True):
            logprobs = torch.log_softmax(logits[row].float(), dim=-1)
            top: tuple[Alternative, ...] = ()
            if count:
                best = torch.topk(logprobs, count)
                pairs = zip(best.indices.tolist(), best.values.tolist(), strict=True)
                top = tuple(Alternative(text(i), v, i) for i, v in pairs)
            items.append(TokenLogprob(text(chosen), float(logprobs[chosen]), top, chosen))
        out.append(items)
    return out


class Sampler:
    def __init__(self, seed: int | None = None, eos_ids: set[int] | None = None) -> None:
        self.eos_ids: set[int] = set(eos_ids or ())
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()

    def sample(
        self, logits: torch.Tensor, requests: Sequence[SamplingRow], grammar_applied: bool = False
    ) -> list[list[int]]:
        """The tokens each request gains this step, from logits [rows, vocab] (float32, any device): one token, or
        for a request with a draft (1 + len(draft) rows) the accepted draft tokens and one more. grammar_applied:
        the logits already carry the grammars' masks."""
        per_row = [r for r in requests for _ in range(r.rows)]
        made = [r.made + j for r in requests for j in range(r.rows)]
        logits = ban_end_tokens(logits, [r.params for r in per_row], made, self.eos_ids)
        # the raw logits are read again only for logprobs (token_logprobs), so otherwise they are changed in place
        in_place = not any(r.params.logprobs is not None for r in requests)
        logits = apply_constraints(logits, per_row, in_place=in_place, grammar_applied=grammar_applied)
        if all(r.params.greedy and not r.params.penalized for r in requests):
            targets = logits.argmax(dim=-1).tolist()
            return _verify_greedy(targets, [r.draft for r in requests])
        logits = logits.cpu()
        out: list[list[int]] = []
        row = 0
        for request in requests:
            out.append(self._sample_group(logits[row : row + request.rows], request))
            row += request.rows
        return out

    def _sample_group(self, rows: torch.Tensor, request: SamplingRow) -> list[int]:
        """Each row's token drawn by inverse CDF from one uniform per output position; a draft token is kept when it
        is the token drawn. So a draft is kept with probability p(d), the output is exactly what decoding without
        drafts would make from the same uniforms, and a seeded request makes the same tokens whatever the batch."""
        params, draft = request.params, request.draft
        tokens: list[int] = []
        for j, row in enumerate(rows):
            row = apply_penalties(row, request)
            if params.greedy:
                choice = int(row.argmax())
            else:
                ids, kept = candidates(row, params)
                probs = torch.softmax(kept, dim=-1)
                if bool(torch.isfinite(probs).all()):
                    index = _inverse_cdf(probs, self._uniform(request, request.made + j))
                else:  # the arithmetic broke down (validated settings keep it from that): the likeliest token
                    index = int(torch.nan_to_num(kept, nan=float("-inf")).argmax())
                choice = index if ids is None else int(ids[index])
            tokens.append(choice)
            if j == len(draft) or draft[j] != choice:
                return tokens
        return tokens

    def _uniform(self, request: SamplingRow, position: int) -> float:
        """The uniform number of one output position: from the request's seed and the position when it has a seed
        (the same tokens whatever the batch, and whatever was drafted), else from the sampler's own stream."""
        if request.params.seed is None:
            return float(torch.rand((), generator=self.generator))
        generator = torch.Generator().manual_seed((request.params.seed * 1_000_003 + position) % (1 << 63))
        return float(torch.rand((), generator=generator))


def _inverse_cdf(probs: torch.Tensor, uniform: float) -> int:
    cumulative = torch.cumsum(probs, dim=-1)
    index = int(torch.searchsorted(cumulative, uniform * float(cumulative[-1]), right=True))
    index = min(index, probs.shape[-1] - 1)
    while probs[index] <= 0 and index > 0:  # the float sum can land on a zero-probability tail token
        index -= 1
    return index


def _verify_greedy(targets: list[int], drafts: Sequence[Sequence[int]]) -> list[list[int]]:
    """Greedy: draft tokens are kept while they are what greedy decoding picks; then greedy's own token."""
    out: list[list[int]] = []
    row = 0
    for draft in drafts:
        tokens: list[int] = []
        for j in range(len(draft) + 1):
            target = targets[row + j]
            tokens.append(target)
            if j == len(draft) or draft[j] != target:
                break
        out.append(tokens)
        row += len(draft) + 1
    return out
