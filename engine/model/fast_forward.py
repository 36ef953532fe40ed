"""A lean forward pass for Llama-family decoders (Llama, SmolLM, Mistral, Qwen2) over the paged cache.

The transformers modeling code spends about 0.6 ms per layer in Python and module dispatch, which at
one sequence is a third of a decode step on a CPU. This module runs the same computation (the model's own
weights, its own rotary embedding module, the same float operations) as a flat loop of tensor calls, with
QKV and gate/up fused and, on CPU float32, oneDNN-prepacked weights. It is checked against the
transformers forward when it is built; any other architecture, or a mismatch, keeps the transformers path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.request import Request
from engine.core.scheduler import ScheduledChunk
from engine.model import attention, compiled_step, kernels
from engine.model import formats as formats_
from engine.model.attention import PagedKVCache, StepContext
from engine.model.batch import ChunkTables, pack
from engine.model.geometry import attention_geometry
from engine.model.lm_head import LMHead
from engine.model.reference import transformers_mode
from engine.types import SamplingParams

log = logging.getLogger(__name__)

SUPPORTED_TYPES = {"llama", "mistral", "qwen2"}


@dataclass
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    sliding_window: int | None


@dataclass
class LinearSet:
    """One weight format's linears, per layer: qkv, o_proj, gate_up, down."""

    layers: list[tuple[nn.Module, nn.Module, nn.Module, nn.Module]]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _sliding_window(config, attn: nn.Module) -> int | None:
    # Qwen2 marks sliding layers on the module; Mistral passes its config value to every layer's attention
    if hasattr(attn, "sliding_window"):
        return attn.sliding_window
    return getattr(config, "sliding_window", None) if config.model_type == "mistral" else None


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the lean forward can't run this model (None when it can)."""
    config = model.config
    if config.model_type not in SUPPORTED_TYPES:
        return f"architecture {config.model_type!r} uses the transformers forward"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "unexpected module layout"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        if any(type(m) is not nn.Linear for m in linears):
            return "quantized or replaced linear layers"
        if mlp.down_proj.bias is not None or attn.o_proj.bias is not None:
            return "biases on output projections"
    return None


class FastForward:
    """Callable like the model for the engine: (input_ids [N], positions [N], keep [S]) -> logits [S, vocab]."""

    def __init__(
        self, model: nn.Module, pack: bool | None = None, formats: Sequence[str] = (), compiled: bool = True
    ) -> None:
        """formats: the weight formats to consider; with more than one, each batch size gets the fastest, measured
        now on this model's layers (formats.py). compiled: every layer of a step in one C++ call (compiled_step.py)
        where it builds here."""
        inner = model.model
        config = model.config
        if pack is None:
            pack = kernels.should_pack(model)
        self.model = model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.final_norm = inner.norm.weight
        self.eps = inner.norm.variance_epsilon
        geometry = attention_geometry(config)
        self.heads, self.kv_heads, self.head_dim = geometry.num_heads, geometry.num_kv_heads, geometry.head_dim
        self.hidden = config.hidden_size
        self.scale = inner.layers[0].self_attn.scaling
        self.q_size = self.heads * self.head_dim
        self.kv_size = self.kv_heads * self.head_dim
        self.intermediate = inner.layers[0].mlp.gate_proj.out_features
        self.norm_shape = (self.hidden,)
        self.layers = [
            _Layer(
                layer.input_layernorm.weight,
                layer.post_attention_layernorm.weight,
                _sliding_window(config, layer.self_attn),
            )
            for layer in inner.layers
        ]
        native = str(next(model.parameters()).dtype).removeprefix("torch.")  # the model's own weights
        head = model.get_output_embeddings()
        # The LM head stays in the model's own format: bfloat16 logits round to steps of 1/8 and more, which turns
        # near-ties into different greedy tokens (measured: the embedded model stopped answering "Paris").
        exact_head = kernels.PackedLinear(head.weight, head.bias) if pack else head
        self.lm_head = LMHead(exact_head, head.weight.detach(), head.bias, try_fast=formats_.BFLOAT16 in formats)
        self.linears = {native: self._native_linears(pack)}
        for fmt in formats:
            if fmt != native:
                self.linears[fmt] = self._formatted_linears(fmt)
        self.choice = formats_.single(native)
        if len(self.linears) > 1:
            key = formats_.machine_key(
                "layers",
                len(self.layers),
                self.hidden,
                self.q_size,
                self.kv_size,
                self.intermediate,
                sorted(self.linears),
            )
            self.choice = formats_.measure({fmt: self._pass(linears) for fmt, linears in self.linears.items()}, key=key)
            self.linears = {fmt: linears for fmt, linears in self.linears.items() if fmt in self.choice.formats}
        self.last_format = native
        self.last_compiled = False  # whether the last step ran the compiled step
        self.kinds = ["lean Llama-family forward", "fused QKV", "fused gate/up MLP", "fused RMSNorm"]
        self.check: FastPathCheck | None = None
        if pack and native in self.linears:
            self.kinds.append("oneDNN prepacked linears")
        if self.choice.formats != {native}:
            self.kinds.append(f"weight formats by batch: {self.choice.describe()}")
        self.compiled: dict[str, compiled_step.CompiledStep] = {}
        self.compiled_note = "off (not asked for)"
        if compiled:
            self.compiled, reason = compiled_step.build_steps(self, self.linears)
            if self.compiled:
                formats_on = ", ".join(sorted(self.compiled))
                self.compiled_note = f"on for {formats_on}" + (f" (not for {reason})" if reason else "")
                self.kinds.append(f"compiled step (C++, {formats_on})")
            else:
                self.compiled_note = f"off: {reason}"

    def _native_linears(self, pack: bool) -> LinearSet:
        """The model's own weights: fused (unpacked, the originals are re-pointed at slices of the fused
        weight: no copy), or prepacked copies for oneDNN."""
        inner = self.model.model
        layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = kernels.fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj], pack)
            gate_up = kernels.fuse_linears([mlp.gate_proj, mlp.up_proj], pack)
            o_proj = kernels.PackedLinear(attn.o_proj.weight, None) if pack else attn.o_proj
            down = kernels.PackedLinear(mlp.down_proj.weight, None) if pack else mlp.down_proj
            layers.append((qkv, o_proj, gate_up, down))
        return LinearSet(layers)

    def _formatted_linears(self, fmt: str) -> LinearSet:
        def linear(modules: list[nn.Linear]) -> nn.Module:
            weight = torch.cat([m.weight.detach() for m in modules])
            bias = None if modules[0].bias is None else torch.cat([m.bias.detach() for m in modules])
            return formats_.make_linear(weight, bias, fmt)

        layers = []
        for layer in self.model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = linear([attn.q_proj, attn.k_proj, attn.v_proj])
            layers.append((qkv, linear([attn.o_proj]), linear([mlp.gate_proj, mlp.up_proj]), linear([mlp.down_proj])))
        return LinearSet(layers)

    def _pass(self, linears: LinearSet):
        """Every linear of the model once on `rows` rows (what the format measurement times)."""

        def run(rows: int) -> None:
            x, q = torch.randn(rows, self.hidden), torch.randn(rows, self.q_size)
            inner = torch.randn(rows, self.intermediate)
            for qkv, o_proj, gate_up, down in linears.layers:
                qkv(x)
                o_proj(q)
                gate_up(x)
                down(inner)

        return run

    def __call__(
        self,
        ctx: StepContext,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        keep: torch.Tensor,
        leading: int | None = None,
        allowed: torch.Tensor | None = None,
        tables: ChunkTables | None = None,
        penalized: list[list[int]] | None = None,
    ) -> torch.Tensor:
        """leading: every sampled row picks among its `leading` likeliest tokens (greedy, top-k), so the LM head may
        compute those exactly and the others approximately (lm_head.py), and `penalized` ids per row exactly too;
        allowed [rows, vocab]: the tokens grammars allow (the candidates are the leading allowed ones); tables: the
        step's chunks and page tables, for the compiled step (without them the Python layers run)."""
        n = input_ids.shape[0]
        hidden = self.embed(input_ids)
        cos, sin = self.rotary(hidden.unsqueeze(0), positions.unsqueeze(0))
        self.last_format = self.choice.format_for(n)
        step = self.compiled.get(self.last_format) if tables is not None else None
        self.last_compiled = False
        if step is not None and ctx.cache.storage.dtype == torch.float32:
            try:
                hidden = step.forward(hidden, cos[0], sin[0], ctx.cache.storage, tables.chunks, tables.pages)
                self.last_compiled = True
            except Exception as exc:  # any failure: never lose the step, the Python layers below redo it (and its KV)
                reason = compiled_step.first_line(exc)
                log.warning("compiled step failed (%s); the Python lean forward runs from now on", reason)
                self.compiled = {}
                self.compiled_note = f"off: failed while running: {reason}"
                self.kinds = [k for k in self.kinds if not k.startswith("compiled step")]
        if not self.last_compiled:
            hidden = self._layers(ctx, hidden, cos[0].unsqueeze(1), sin[0].unsqueeze(1))  # [N, 1, dim]: over heads
        hidden = F.rms_norm(hidden.index_select(0, keep), self.norm_shape, self.final_norm, self.eps)
        if leading is None:
            return self.lm_head.exact(hidden)
        return self.lm_head.leading(hidden, leading, allowed, penalized)

    def _layers(self, ctx: StepContext, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Every decoder layer in Python: the hidden states after the last one."""
        n = hidden.shape[0]
        norm_shape, eps = self.norm_shape, self.eps
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        linears = self.linears[self.last_format]
        for index, (layer, (qkv, o_proj, gate_up, down)) in enumerate(zip(self.layers, linears.layers, strict=True)):
            x = F.rms_norm(hidden, norm_shape, layer.input_norm, eps)
            qk, v = qkv(x).split((self.q_size + self.kv_size, self.kv_size), dim=-1)
            # rotary on queries and keys together: one set of elementwise calls instead of two
            qk = qk.view(n, heads + kv_heads, head_dim)
            qk = qk * cos + _rotate_half(qk) * sin
            attended = attention.paged_attention(
                ctx,
                index,
                qk[:, :heads],
                qk[:, heads:],
                v.view(n, kv_heads, head_dim),
                self.scale,
                layer.sliding_window,
            )
            hidden = hidden + o_proj(attended.view(n, self.q_size))
            x = F.rms_norm(hidden, norm_shape, layer.post_norm, eps)
            gate, up = gate_up(x).split(self.intermediate, dim=-1)
            hidden = hidden + down(F.silu(gate) * up)
        return hidden


_ATTR = "_studio_fast_forward"
_REJECTED = "_studio_fast_forward_rejected"
# prefill (longer than the compiled step's attention loops take), a chunk over cached pages, two decode steps
CHECK_STAGES = ((0, 20), (20, 4), (24, 1), (25, 1))
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 2e-2}  # of the logits' scale
# weight formats' own rounding: a sanity bound (a layout bug is off by the logits' whole scale), not an accuracy claim
FORMAT_TOLERANCE = {formats_.BFLOAT16: 5e-2, formats_.INT8: 0.15, formats_.INT4: 0.4}


@dataclass(frozen=True)
class FastPathCheck:
    """The lean forward against transformers' own, on a seeded random sequence through a scratch page pool."""

    passed: bool
    max_rel_error: float
    tolerance: float
    stages: str = (
        "prefill 20, chunked prefill 4 over cached pages, decode 2 over cached pages (seed 0), through the Python "
        "layers and the compiled step"
    )

    def describe(self) -> str:
        verdict = "agrees" if self.passed else "DISAGREES"
        return f"{verdict} with transformers (max error {self.max_rel_error:.1e} of the logits' scale)"


def build(
    model: nn.Module, check: bool = True, formats: Sequence[str] = (), compiled: bool = True
) -> FastForward | None:
    """The lean forward for this model (built once per model and set of formats), or None (with the reason logged)
    when it doesn't apply or disagrees with the transformers forward."""
    built = getattr(model, _ATTR, {})
    key = (tuple(formats), compiled)
    if key in built:
        return built[key]
    fast = None
    reason = unsupported_reason(model)
    if reason:
        log.info("lean forward off: %s", reason)
    else:
        fast = FastForward(model, formats=formats, compiled=compiled)
        if check:
            fast.check = check_against_transformers(model, fast)
            if not fast.check.passed:
                log.warning("lean forward %s; using the transformers forward", fast.check.describe())
                setattr(model, _REJECTED, fast.check)
                fast = None
    built[key] = fast
    setattr(model, _ATTR, built)
    return fast


def rejected_check(model: nn.Module) -> FastPathCheck | None:
    """The failed check that turned the lean forward off for this model, if one did."""
    return getattr(model, _REJECTED, None)


def check_against_transformers(model: nn.Module, fast: FastForward) -> FastPathCheck:
    """Both forwards over a seeded random sequence: the lean one step by step through a scratch page pool
    (prefill, a chunk over cached pages, decodes over cached pages; through its Python layers, and again with the
    compiled step where there is one), transformers' in one pass."""
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    total = sum(CHECK_STAGES[-1])
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (total,), generator=generator).tolist()
    with torch.inference_mode(), transformers_mode(model):
        reference = model(input_ids=torch.tensor([ids], device=device)).logits[0].float()
    page_size = 4
    worst = 0.0
    for compiled in (False, True) if fast.compiled else (False,):
        cache = PagedKVCache(
            len(fast.layers), fast.kv_heads, fast.head_dim, total // page_size + 1, page_size, dtype, device
        )
        request = Request("fast-path-check", ids, SamplingParams())
        request.page_table = list(reversed(range(cache.num_pages)))  # pages out of order, as a busy pool hands out
        with torch.inference_mode():
            for start, count in CHECK_STAGES:
                batch = pack([ScheduledChunk(request, count, start, samples=True)], cache, tables=compiled)
                ours = fast(batch.context, batch.input_ids, batch.positions, batch.keep, tables=batch.tables)
                ours = ours.float()[0]
                expected = reference[start + count - 1]
                scale = expected.abs().max().clamp_min(1e-6)
                worst = max(worst, float((ours - expected).abs().max() / scale))
    # lower-precision formats (chosen for some batch sizes) are judged by their own tolerance
    tolerance = max(TOLERANCE.get(dtype, 5e-2), *(FORMAT_TOLERANCE.get(f, 0.0) for f in fast.choice.formats))
    return FastPathCheck(passed=worst < tolerance, max_rel_error=worst, tolerance=tolerance)
