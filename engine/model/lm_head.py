"""The LM head: float32 logits, or, for steps that only pick among the likeliest tokens (greedy, or top-k sampling),
bfloat16 logits with the leading candidates recomputed in float32 (half the bytes of the largest matrix; what is
picked from is float32's)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.model import formats

CANDIDATES = 8  # recomputed exactly; bfloat16's rounding (about 0.1 of a logit) never reorders a lead wider than that
TOP_K_MARGIN = 32  # top-k sampling: candidates recomputed beyond k, so bfloat16 does not decide who is k-th
MAX_TOP_K = 256  # above this, computing the exact head costs less than the candidates


EXACT_BLOCK_ROWS = 4096  # a quantized head's rows dequantized at a time for an exact pass (a few MiB of float32)


class DequantizedHead(nn.Module):
    """A head held in a weight module (int8, int4, 16-bit), computed exactly in float32 over its dequantized weights,
    a block of rows at a time: for the steps that need every logit exact (logprobs, a logit bias)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._module = [module]  # not registered: the model owns it
        self.out_features = module.out_features

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        module = self._module[0]
        x = hidden.float()
        out = torch.empty(x.shape[0], self.out_features, device=x.device)
        for start in range(0, self.out_features, EXACT_BLOCK_ROWS):
            ids = torch.arange(start, min(start + EXACT_BLOCK_ROWS, self.out_features), device=x.device)
            torch.matmul(x, module.dequantize(ids).t(), out=out[:, start : start + len(ids)])
        if module.bias is not None:
            out += module.bias
        return out


class LMHead:
    """exact(hidden) -> float32 logits; greedy(hidden) -> logits whose CANDIDATES best are exact (the others may be
    off by bfloat16's rounding): argmax over them is float32's argmax. Without a faster bfloat16 head here, both are
    the float32 head."""

    def __init__(
        self, exact: nn.Module, weight: torch.Tensor | None, bias: torch.Tensor | None, try_fast: bool
    ) -> None:
        """exact: the head as the model stores it (float32 logits out); weight: its float32 weight [vocab, hidden],
        rows read back for the candidates, or None for a quantized or 16-bit head (no faster twin: exact is it)."""
        self.exact = exact
        self.weight = weight
        self.bias = bias
        self.fast: nn.Module | None = None
        self.rows_of: Callable[[torch.Tensor], torch.Tensor] | None = None  # exact weight rows of token ids
        if try_fast and weight is not None:
            fast = formats.make_linear(weight, bias, formats.BFLOAT16)
            x = torch.randn(1, weight.shape[1])
            passes = {formats.FLOAT32: lambda _rows: exact(x), formats.BFLOAT16: lambda _rows: fast(x)}
            key = formats.machine_key("lm head", *weight.shape)
            if formats.measure(passes, buckets=(1,), key=key).format_for(1) == formats.BFLOAT16:
                self.fast = fast

    @classmethod
    def stored(cls, module: nn.Module) -> LMHead:
        """A head held in a weight module (int8, int4, 16-bit): the module itself is the fast head (bfloat16 rows in,
        its rounding out), and what is picked from is float32 over its dequantized weights, exact for the weights as
        stored: the leading candidates recomputed from their rows, every logit when all are asked for."""
        head = cls(DequantizedHead(module), None, module.bias, try_fast=False)
        head.fast = module
        head.rows_of = module.dequantize
        return head

    def greedy(self, hidden: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
        """allowed [rows, vocab]: only these tokens may be picked (a grammar's mask); the others get -inf, before the
        candidates are chosen, so the likeliest allowed token is among the exact ones."""
        return self.leading(hidden, CANDIDATES, allowed)

    def leading(
        self,
        hidden: torch.Tensor,
        count: int,
        allowed: torch.Tensor | None = None,
        extra: list[list[int]] | None = None,
    ) -> torch.Tensor:
        """Logits whose `count` best (allowed) tokens per row, and each row's `extra` ids (tokens a repetition penalty
        lowers, which may fall below others), are float32's; the rest bfloat16's."""
        if self.fast is None or not hidden.shape[0]:
            logits = self.exact(hidden)
            return logits if allowed is None else logits.masked_fill_(~allowed, float("-inf"))
        logits = self.fast(hidden)
        if allowed is not None:
            logits.masked_fill_(~allowed, float("-inf"))
        top = torch.topk(logits, min(count, logits.shape[-1]), dim=-1).indices  # [rows, count]
        self._recompute(logits, hidden, top, allowed)
        for row, ids in enumerate(extra or ()):
            if ids:
                index = torch.tensor(ids, dtype=torch.long, device=logits.device).unsqueeze(0)
                self._recompute(logits[row : row + 1], hidden[row : row + 1], index, None if allowed is None else
                                allowed[row : row + 1])  # fmt: skip
        return logits

    def _recompute(
        self, logits: torch.Tensor, hidden: torch.Tensor, ids: torch.Tensor, allowed: torch.Tensor | None
    ) -> None:
        """logits[r, ids[r]] = the float32 head's values (disallowed ones stay -inf)."""
        flat = ids.reshape(-1)
        picked = self.weight.index_select(0, flat) if self.rows_of is None else self.rows_of(flat)
        rows = picked.view(*ids.shape, -1)  # [rows, n, hidden]
        exact = torch.bmm(rows, hidden.float().unsqueeze(-1)).squeeze(-1)
        if self.bias is not None:
            exact += self.bias[ids]
        if allowed is not None:  # fewer allowed tokens than candidates: the disallowed ones among them stay -inf
            exact.masked_fill_(~allowed.gather(-1, ids), float("-inf"))
        logits.scatter_(-1, ids, exact)
