"""The LM head: float32 logits, or, for steps that only pick among the likeliest tokens (greedy, or top-k sampling),
bfloat16 logits with every token that can be among the leaders recomputed in float32 (half the bytes of the largest
matrix; what is picked from is float32's)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

from engine.model import formats, int4pack, tiles
from engine.model.quantized import Int4Linear, Int8Linear

CANDIDATES = 8  # recomputed first; near-ties within bfloat16's error of the leaders are recomputed beyond them
TOP_K_MARGIN = 32  # top-k sampling: candidates recomputed beyond k, so the check below rarely finds more to recompute
MAX_TOP_K = 256  # above this, computing the exact head costs less than the candidates
FULL_ROW = 4096  # more tokens than this within the error of a row's leaders: its whole float32 row is cheaper

# Unit roundoffs: bfloat16 keeps 8 significant bits, float32 24.
BF16_U = 2.0**-8
F32_U = 2.0**-24


# a quantized head's rows dequantized at a time for an exact pass without the compiled kernel: a few MiB of float32
# (4096 rows of a 3B model's head, 32 MiB, took 270 ms a pass against 75-100 ms at 256-1024 rows)
EXACT_BLOCK_ROWS = 512


class DequantizedHead(nn.Module):
    """A head held in a weight module (int8, int4, 16-bit), computed exactly in float32 over its dequantized weights,
    a block of rows at a time: for the steps that need every logit exact (logprobs, a logit bias)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._module = [module]  # not registered: the model owns it
        self.in_features, self.out_features = module.in_features, module.out_features

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        module = self._module[0]
        x = hidden.float()
        out = _exact_kernel(module, x) if x.device.type == "cpu" and _exact_kernels() else None
        if out is not None:
            return out if module.bias is None else out.add_(module.bias)
        out = torch.empty(x.shape[0], self.out_features, device=x.device)
        for start in range(0, self.out_features, EXACT_BLOCK_ROWS):
            ids = torch.arange(start, min(start + EXACT_BLOCK_ROWS, self.out_features), device=x.device)
            torch.matmul(x, module.dequantize(ids).t(), out=out[:, start : start + len(ids)])
        if module.bias is not None:
            out += module.bias
        return out


def _exact_kernels() -> bool:
    """The compiled step's library is loaded (engine/model/compiled_step.py), with its exact int8 and int4 heads."""
    global _HAS_EXACT
    if not _HAS_EXACT:  # asked again until it is loaded: a later load brings it
        _HAS_EXACT = hasattr(torch.ops.studio, "int4_exact_mm")
    return _HAS_EXACT


_HAS_EXACT = False


def _exact_kernel(module: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """float32 x @ the module's dequantized weights^T, the codes widened as they are read (a 3B model's head: ~10 ms
    int8 and ~40 ms int4 a row, against ~75 ms and ~1.8 s dequantizing blocks of rows); None for other modules."""
    if isinstance(module, Int8Linear) and module.q.is_contiguous():
        return torch.ops.studio.int8_exact_mm(x, module.q, module.scale)
    layout = int4pack.layout()
    if isinstance(module, Int4Linear) and module.packed.is_contiguous() and layout is not None:
        scales = module.scales_and_zeros.contiguous()
        out = torch.ops.studio.int4_exact_mm(x, module.packed, scales, layout.block, layout.split)
        return out[:, : module.out_features].contiguous() if out.shape[1] != module.out_features else out
    return None


INT8_GROUP = 32  # inputs per int8 step of the activations (decode_step.cpp's quantize_groups)


class Int8ActivationsHead(nn.Module):
    """A stored int8 or int4 head's weights times int8 activations (decode_step.cpp's int8_vnni_mm, int4_vnni_mm):
    float32 logits for ranking, about twice as fast as torch's weight-only kernels on one row, measured at load."""

    def __init__(self, module: Int8Linear | Int4Linear) -> None:
        super().__init__()
        self._module = [module]  # not registered: the model owns it
        self.in_features, self.out_features = module.in_features, module.out_features
        self._scales = module.scales_and_zeros.contiguous() if isinstance(module, Int4Linear) else None

    @classmethod
    def measured(cls, module: nn.Module) -> Int8ActivationsHead | None:
        """The int8-activation head of `module` where it runs here and one row through it was measured faster than
        through the module's own kernel (remembered per machine and shape) or INFERENCE_STUDIO_VNNI forces it (=never:
        never), else None."""
        if not _vnni_head_runs(module):
            return None
        fast = cls(module)
        if tiles.vnni_forced() in ("always", "amx"):  # forced, as the other products
            return fast
        x = torch.randn(1, module.in_features)
        passes = {"kernel": lambda _rows: module(x), "int8 activations": lambda _rows: fast(x)}
        key = formats.machine_key("lm head int8 activations", type(module).__name__, module.out_features,
                                  module.in_features)  # fmt: skip
        return fast if formats.measure(passes, buckets=(1,), key=key).format_for(1) == "int8 activations" else None

    @property
    def module(self) -> Int8Linear | Int4Linear:
        """The stored head whose weights this multiplies."""
        return self._module[0]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        module, rows = self._module[0], hidden.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        if self._scales is None:
            out = torch.ops.studio.int8_vnni_mm(rows, module.q, module.scale)
        else:
            layout = int4pack.layout()
            out = torch.ops.studio.int4_vnni_mm(rows, module.packed, self._scales, layout.block, layout.split)
            if out.shape[1] != self.out_features:  # the packing's padding rows
                out = out[:, : self.out_features].contiguous()
        return out if module.bias is None else out + module.bias


def _vnni_head_runs(module: nn.Module) -> bool:
    """The compiled step's VNNI products are here and take this head (rows of whole groups of 32 inputs)."""
    if tiles.vnni_forced() == "never" or not _exact_kernels():
        return False
    if not torch.ops.studio.int4_vnni() or module.in_features % INT8_GROUP:
        return False
    if module.in_features * module.out_features < tiles.MIN_WEIGHTS:  # tiny test models rank alike on every machine
        return False
    if isinstance(module, Int8Linear):
        return module.q.is_contiguous() and module.q.device.type == "cpu"
    return isinstance(module, Int4Linear) and int4pack.layout() is not None and module.packed.device.type == "cpu"


class LMHead:
    """exact(hidden) -> float32 logits; leading(hidden, count) -> logits whose leaders are float32's: every token
    that can be among a row's `count - TOP_K_MARGIN` best (its best, for count <= CANDIDATES) by the float32 head is
    recomputed exactly, the others keep bfloat16 values that are provably below them. Without a faster bfloat16
    head here, both are the float32 head."""

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
                self.use_fast(fast)

    def use_fast(self, fast: nn.Module, max_row_norm: float | None = None, margin: float = 1.0) -> None:
        """Pick leaders from `fast`, a float32-in, float32-out bfloat16 linear of the same weight (FormattedLinear:
        inputs and weights rounded to bfloat16, products summed in float32, the sum rounded to bfloat16).
        max_row_norm: the largest weight row's norm (read from the weight when None); margin multiplies the error
        of the products (a quantized kernel rebuilds its weights in bfloat16 from codes, scales and zeros)."""
        self.fast = fast
        if max_row_norm is None:
            max_row_norm = float(self.weight.float().norm(dim=1).max())
        n = self.exact.in_features if self.weight is None else self.weight.shape[1]
        # How far the bfloat16 head's logit a_t of token t can be from the float32 head's, for a hidden row x:
        #   rounding x and w_t: (2u + u^2) * sum_i |w_ti x_i|; float32 sums in both heads: 2 * gamma_n * that sum;
        #   rounding the output: u * |a_t - bias_t|. And sum_i |w_ti x_i| <= max_t ||w_t|| * ||x|| (Cauchy-Schwarz).
        gamma = n * F32_U / (1 - n * F32_U)
        product = (2 * BF16_U + BF16_U**2 + 2 * gamma * (1 + BF16_U) ** 2) * 1.01  # 1 %: the float32 bias add
        self._norm_error = product * margin * max_row_norm  # times ||x||
        self._output_error = BF16_U * 1.01  # times |a_t| + |bias_t|
        self._bias_error = 0.0 if self.bias is None else self._output_error * float(self.bias.detach().abs().max())

    @classmethod
    def stored(cls, module: nn.Module) -> LMHead:
        """A head held in a weight module (int8, int4, 16-bit): the module itself is the fast head (bfloat16 rows in,
        its rounding out), or its weights times int8 activations where measured faster (Int8ActivationsHead), and
        what is picked from is float32 over its dequantized weights, exact for the weights as stored: the leading
        candidates recomputed from their rows, every logit when all are asked for."""
        head = cls(DequantizedHead(module), None, module.bias, try_fast=False)
        head.rows_of = module.dequantize
        norm = _max_row_norm(module)
        if (fast := Int8ActivationsHead.measured(module)) is not None:
            head.use_int8_activations(fast, norm)
            return head
        # margin 4: the kernel rebuilds each weight from its code, scale and zero in bfloat16 (a rounding or two more
        # on each product than a bfloat16 weight has); a wider bound only recomputes a few more near-ties
        head.use_fast(module, max_row_norm=norm, margin=4.0)
        return head

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """The head without the twin a timing chose (a float32 head's bfloat16 twin, a stored head's int8
        activations): what the fast path's check compares, so its verdict is the same on every machine, whichever
        was measured faster here. A float32 head gives every logit exact; a stored head ranks with its own module,
        as transformers' forward computes it."""
        saved = dict(self.__dict__)
        try:
            if self.weight is not None:
                self.fast = None
            elif isinstance(self.fast, Int8ActivationsHead):
                self.use_fast(self.fast.module, max_row_norm=self._row_norm, margin=4.0)
            yield
        finally:
            self.__dict__.clear()
            self.__dict__.update(saved)

    def use_int8_activations(self, fast: nn.Module, max_row_norm: float) -> None:
        """Pick leaders from `fast`, the stored weights times int8 activations (Int8ActivationsHead): float32 out."""
        self.fast = fast
        self._row_norm = max_row_norm  # read once at load (a pass over the head); untimed() bounds the module by it
        n = self.exact.in_features
        # The activations' error, per element: rounding to bfloat16 (u |x_i|), then to its group's int8 step (at most
        # half of the group's largest / 127, that largest up to (1 + u) of x's): in norm at most
        # (u + (1 + u) sqrt(32) / 254) ||x|| (the groups' largest squared sum to at most ||x||^2). Times ||w_t||
        # (Cauchy-Schwarz); float32 sums of the groups' products, 2 gamma_n of that sum again; the output's rounding
        # (the row scale's product, the bias add) 2 float32 units of |a_t|.
        gamma = n * F32_U / (1 - n * F32_U)
        activations = BF16_U + (1 + BF16_U) * math.sqrt(INT8_GROUP) / 254
        self._norm_error = (activations + 2 * gamma) * (1 + activations) * 1.01 * max_row_norm  # times ||x||
        self._output_error = 2 * F32_U * 1.01  # times |a_t| + |bias_t|
        self._bias_error = 0.0 if self.bias is None else self._output_error * float(self.bias.detach().abs().max())

    def greedy(self, hidden: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
        """allowed [rows, vocab]: only these tokens may be picked (a grammar's mask, end tokens banned by min_tokens);
        the others get -inf, before the leaders are chosen, so the likeliest allowed token is an exact one."""
        return self.leading(hidden, CANDIDATES, allowed)

    def leading(
        self,
        hidden: torch.Tensor,
        count: int,
        allowed: torch.Tensor | None = None,
        extra: list[list[int]] | None = None,
    ) -> torch.Tensor:
        """Logits whose leading (allowed) tokens per row, and each row's `extra` ids (tokens a repetition penalty
        lowers, which may fall below others), are float32's; the rest bfloat16's, each provably below the leaders.
        Leading: the `count - TOP_K_MARGIN` best (top-k sampling asks for k + TOP_K_MARGIN), or the best where count
        is smaller (greedy asks for CANDIDATES). Extra ids are left out of the comparison (a penalty changes their
        values after): the leaders are found among the other tokens, so they stay the leaders after the penalty."""
        if self.fast is None or not hidden.shape[0]:
            logits = self.exact(hidden)
            return logits if allowed is None else logits.masked_fill_(~allowed, float("-inf"))
        logits = self.fast(hidden)
        if allowed is not None:
            logits.masked_fill_(~allowed, float("-inf"))
        vocab = logits.shape[-1]
        ranked = torch.topk(logits, min(count + 1, vocab), dim=-1)  # one more: the best bfloat16 logit left out
        top = ranked.indices[:, :count]  # [rows, count]
        runner_up = ranked.values[:, count] if count < vocab else torch.full_like(ranked.values[:, 0], float("-inf"))
        compared = self._recompute(logits, hidden, top, allowed)  # the exact values the leaders are taken from
        for row, ids in enumerate(extra or ()):
            if ids:
                index = torch.tensor(ids, dtype=torch.long, device=logits.device).unsqueeze(0)
                self._recompute(logits[row : row + 1], hidden[row : row + 1], index, None if allowed is None else
                                allowed[row : row + 1])  # fmt: skip
                compared[row].masked_fill_(torch.isin(top[row], index[0]), float("-inf"))
        # greedy asks for CANDIDATES (its best must be exact), top-k sampling for k + TOP_K_MARGIN (its k best)
        need = min(count - TOP_K_MARGIN if count > TOP_K_MARGIN else 1, compared.shape[-1])
        threshold = torch.topk(compared, need, dim=-1).values[:, -1]  # [rows]; -inf: too few tokens to compare
        self._recompute_contenders(logits, hidden, threshold, runner_up, allowed)
        return logits

    def _recompute_contenders(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        threshold: torch.Tensor,
        runner_up: torch.Tensor,
        allowed: torch.Tensor | None,
    ) -> None:
        """Recompute every token whose float32 logit may reach its row's threshold (the `need`-th best exact one):
        its bfloat16 logit a is within error(a) = output_error * (|a| + |bias|) + norm_error * ||x|| of it, so only
        tokens with a + output_error * |a| >= threshold - reach can, where reach is the rest of the error. Rows
        whose runner-up (the best bfloat16 logit not recomputed) is below that have none: most rows."""
        reach = self._norm_error * hidden.float().norm(dim=-1) + self._bias_error  # [rows]
        target = threshold - reach
        # a + e|a| is increasing in a: its inverse at the target is the lowest bfloat16 logit that may contend
        lowest = torch.where(target >= 0, target / (1 + self._output_error), target / (1 - self._output_error))
        for row in (runner_up >= lowest).nonzero().view(-1).tolist():
            line = logits[row]
            ids = ((line >= lowest[row]) & torch.isfinite(line)).nonzero().view(-1)  # the leaders too: cheap
            if ids.numel() > FULL_ROW:  # a flat row: its whole float32 row costs less
                exact = self.exact(hidden[row : row + 1])[0]
                logits[row] = exact if allowed is None else exact.masked_fill_(~allowed[row], float("-inf"))
                continue
            rows = self.weight.index_select(0, ids) if self.rows_of is None else self.rows_of(ids)
            exact = rows @ hidden[row].float()
            if self.bias is not None:
                exact += self.bias[ids]
            line[ids] = exact  # disallowed tokens are -inf, never contending: they stay -inf

    def _recompute(
        self, logits: torch.Tensor, hidden: torch.Tensor, ids: torch.Tensor, allowed: torch.Tensor | None
    ) -> torch.Tensor:
        """logits[r, ids[r]] = the float32 head's values (disallowed ones stay -inf); those values returned."""
        flat = ids.reshape(-1)
        picked = self.weight.index_select(0, flat) if self.rows_of is None else self.rows_of(flat)
        rows = picked.view(*ids.shape, -1)  # [rows, n, hidden]
        exact = torch.bmm(rows, hidden.float().unsqueeze(-1)).squeeze(-1)
        if self.bias is not None:
            exact += self.bias[ids]
        if allowed is not None:  # fewer allowed tokens than candidates: the disallowed ones among them stay -inf
            exact.masked_fill_(~allowed.gather(-1, ids), float("-inf"))
        logits.scatter_(-1, ids, exact)
        return exact


def _max_row_norm(module: nn.Module) -> float:
    """The largest row norm of a stored head's weights, a block of rows at a time (no float32 copy of it all). Int8
    rows are q * scale: the norm of q times the scale, from slices (gathering and scaling every row was ~0.5 s of a
    3B model's start), nudged up by 1e-5 for the rounding of that product (an upper bound is what the error needs)."""
    norm = 0.0
    for start in range(0, module.out_features, EXACT_BLOCK_ROWS):
        end = min(start + EXACT_BLOCK_ROWS, module.out_features)
        if isinstance(module, Int8Linear):
            block = module.q[start:end].float().norm(dim=1) * module.scale[start:end].float() * (1 + 1e-5)
        else:
            block = module.dequantize(torch.arange(start, end)).norm(dim=1)
        norm = max(norm, float(block.max()))
    return norm
