"""A lean forward pass for Llama-family decoders (Llama, SmolLM, Mistral, Qwen2) over the paged cache.

The transformers modeling code spends about 0.6 ms per layer in Python and module dispatch, which at
one sequence is a third of a decode step on a CPU. This module runs the same computation (the model's own
weights, its own rotary embedding module, the same float operations) as a flat loop of tensor calls, with
QKV and gate/up fused and, on CPU float32, oneDNN-prepacked weights. It is checked when it is built against the
transformers forward, or the dense forward of the engine's own modules (llama_family.py) for a model built from them;
any other architecture, or a mismatch, keeps the transformers path.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.load.memory import free_memory_bytes
from engine.model import (
    attention,
    bf16_blocks,
    check_memory,
    compiled_step,
    kernels,
    llama_family,
    quantized,
    stored,
    weights,
)
from engine.model import formats as formats_
from engine.model.attention import PagedKVCache, StepContext
from engine.model.batch import ChunkTables, pack
from engine.model.geometry import attention_geometry
from engine.model.llama_family import rotate_half
from engine.model.lm_head import CANDIDATES, LMHead
from engine.model.reference import transformers_mode
from engine.model.step_plan import ChunkPlan, SamplingRow, StepPlan
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


def _sliding_window(config, attn: nn.Module) -> int | None:
    # Qwen2 marks sliding layers on the module; Mistral passes its config value to every layer's attention
    if hasattr(attn, "sliding_window"):
        return attn.sliding_window
    return getattr(config, "sliding_window", None) if config.model_type == "mistral" else None


def _decoder_linears(layer: nn.Module) -> list[nn.Module]:
    attn, mlp = layer.self_attn, layer.mlp
    return [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]


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
        linears = _decoder_linears(layer)
        if not all(weights.is_linear(m) for m in linears):
            return "linear layers the engine has no kernel for (bitsandbytes or replaced modules)"
        if layer.mlp.down_proj.bias is not None or layer.self_attn.o_proj.bias is not None:
            return "biases on output projections"
    if not weights.is_linear(model.get_output_embeddings()):
        return "an LM head the engine has no kernel for"
    return None


# The weight-format measurement and the fast path's check each touch a few layers, whatever the model's size: about
# this many weights (enough that they stream from memory as a real step's do) and at most BUDGET_MAX_LAYERS layers
BUDGET_PARAMETERS = 48_000_000
BUDGET_MAX_LAYERS = 8
CHECK_LAYERS = 2
# a copy beside weights held as stored is made only up to this size and where it fits this share of the memory
# available now. Held as stored means memory comes first (what llama.cpp needs is the target, and the loader's
# estimate counts no copy): at 1 GiB, a 0.5B Q4 file's bfloat16 copy took its process from 0.9 to 1.6 GB.
COPY_MAX_BYTES = 256 << 20
COPY_MEMORY_SHARE = 0.25


class FastForward:
    """Callable like the model for the engine: (input_ids [N], positions [N], keep [S]) -> logits [S, vocab]."""

    def __init__(
        self,
        model: nn.Module,
        pack: bool | None = None,
        formats: Sequence[str] = (),
        compiled: bool = True,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """formats: the weight formats to consider beside the model's own (copies); with more than one, each batch
        size gets the fastest, measured now on a few of this model's layers (formats.py). compiled: every layer of a
        step in one C++ call (compiled_step.py) where it builds here. progress: told what is measured (status bar)."""
        self.model = model
        self.device = weights.device_of(model)
        # hidden states flow in float32 on a CPU whatever the weights are stored in (the compiled step's and the
        # quantized kernels' contract); elsewhere in the model's own dtype
        self.dtype = torch.float32 if self.device.type == "cpu" else weights.activation_dtype(model)
        if pack is None:
            pack = kernels.should_pack(model)
        self._read_shapes(model)
        decoder = [m for layer in model.model.layers for m in _decoder_linears(layer)]
        native = " + ".join(sorted({weights.linear_format(m) for m in decoder}))  # the weights as stored
        self.stored_format = native
        if compiled and self.device.type == "cpu":  # first: a stored head ranks with its products where they are faster
            compiled_step.ensure_loaded(progress)
        self.lm_head = self._make_lm_head(model.get_output_embeddings(), pack, formats)
        self.kinds = ["lean Llama-family forward", "fused QKV", "fused gate/up MLP", "fused RMSNorm"]
        self._choose_formats(native, formats, pack, progress)
        self.last_format = native
        self.last_compiled = False  # whether the last step ran the compiled step
        self.check: FastPathCheck | None = None
        self.compiled: dict[str, compiled_step.CompiledStep] = {}
        self._quantized_formats: dict[str, bool] = {}  # formats whose linears run as unpacked tiles on many rows
        self.compiled_note = "off (not asked for)"
        if compiled:
            self._build_compiled(progress)

    def _read_shapes(self, model: nn.Module) -> None:
        """The model's sizes, its embedding, rotary and final norm, and each layer's norms and window."""
        inner, config = model.model, model.config
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.final_norm = inner.norm.weight.detach().to(self.dtype)
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
                layer.input_layernorm.weight.detach().to(self.dtype),
                layer.post_attention_layernorm.weight.detach().to(self.dtype),
                _sliding_window(config, layer.self_attn),
            )
            for layer in inner.layers
        ]

    def _make_lm_head(self, head: nn.Module, pack: bool, formats: Sequence[str]) -> LMHead:
        # The LM head stays in the model's own format: bfloat16 logits round to steps of 1/8 and more, which turns
        # near-ties into different greedy tokens (measured: the embedded model stopped answering "Paris"). A float32
        # head may get a faster bfloat16 twin for ranking; a quantized or 16-bit head ranks with its own kernel; in
        # both, what is picked from is float32 over the head's weights (lm_head.py).
        if type(head) is nn.Linear and head.weight.dtype == self.dtype:
            exact_head = kernels.PackedLinear(head.weight, head.bias) if pack else head
            try_fast = self.dtype == torch.float32 and formats_.BFLOAT16 in formats
            return LMHead(exact_head, head.weight.detach(), head.bias, try_fast=try_fast)
        return LMHead.stored(stored.weight_module(head))

    def _choose_formats(
        self, native: str, formats: Sequence[str], pack: bool, progress: Callable[[str], None] | None
    ) -> None:
        """The linears in the model's own format, and in each other format that is fastest for some batch size."""
        self.linears = {native: self._native_linears(pack)}
        self._copies: dict[str, dict[int, tuple[nn.Module, ...]]] = {}  # by format, by layer
        self.copy_notes: list[str] = []
        candidates = [fmt for fmt in dict.fromkeys(formats) if fmt != native and self._copy_fits(fmt)]
        self.choice = formats_.single(native)
        if candidates:
            self.choice = self._measure(native, candidates, progress)
        for fmt in sorted(self.choice.formats - {native}):
            self.linears[fmt] = self._formatted_linears(fmt, range(len(self.layers)))
            if weights.formats_of(self.model) - {formats_.FLOAT32}:  # a copy beside weights held as stored: say so
                self.copy_notes.append(f"a {fmt} copy of the {native} weights ({self._copy_bytes(fmt) >> 20} MiB)")
        self.linears = {fmt: linears for fmt, linears in self.linears.items() if fmt in self.choice.formats}
        self._copies = {}  # the measurement's copies of formats not chosen are dropped
        if pack and native in self.linears and formats_.FLOAT32 in native:
            self.kinds.append("oneDNN prepacked linears")
        if self.choice.formats != {native}:
            self.kinds.append(f"weight formats by batch: {self.choice.describe()}")
        self.kinds.extend(self.copy_notes)

    def _build_compiled(self, progress: Callable[[str], None] | None = None) -> None:
        self.compiled, reason = compiled_step.build_steps(self, self.linears, progress)
        if self.compiled:
            formats_on = ", ".join(sorted(self.compiled))
            self.compiled_note = f"on for {formats_on}" + (f" (not for {reason})" if reason else "")
            self.kinds.append(f"compiled step (C++, {formats_on})")
            self.kinds.extend(sorted({note for step in self.compiled.values() if (note := step.tiles_note)}))
            head = self.lm_head.fast  # a stored head: the module itself ranks the tokens (lm_head.py)
            # a stored head takes the tiles its format was measured for
            if isinstance(head, (quantized.Int4Linear, quantized.Int8Linear)):
                head.tiles_from = max(step.tiles_from.get(head.format, 0) for step in self.compiled.values())
            # a stored 16-bit head multiplies its decode rows as the step's float weights were measured to
            if isinstance(head, quantized.HalfLinear) and head.weight.device.type == "cpu":
                head.claimed_to = max(step.claimed_to for step in self.compiled.values())
        else:
            self.compiled_note = f"off: {reason}"

    def _native_linears(self, pack: bool) -> LinearSet:
        """The model's own weights as stored: same-format neighbours fused (float weights unpacked and int8/int4
        packings are concatenated with the originals re-pointed at slices of them: no copy), or prepacked float32
        copies for oneDNN."""
        layers = []
        for layer in self.model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            layers.append(
                (
                    stored.projection([attn.q_proj, attn.k_proj, attn.v_proj], self.dtype, pack),
                    stored.projection([attn.o_proj], self.dtype, pack),
                    stored.projection([mlp.gate_proj, mlp.up_proj], self.dtype, pack),
                    stored.projection([mlp.down_proj], self.dtype, pack),
                )
            )
        return LinearSet(layers)

    def _formatted_linears(self, fmt: str, indices: Iterable[int]) -> LinearSet:
        """Copies of the given layers' weights in `fmt` (made from the float weights, or the quantized ones
        dequantized), reusing copies made earlier (for the measurement)."""
        made = self._copies.setdefault(fmt, {})

        def linear(modules: list[nn.Module]) -> nn.Module:
            weight = torch.cat([weights.dequantize(m) for m in modules])
            bias = None if modules[0].bias is None else torch.cat([m.bias.detach().float() for m in modules])
            return formats_.make_linear(weight, bias, fmt)

        layers = []
        for index in indices:
            if index not in made:
                layer = self.model.model.layers[index]
                attn, mlp = layer.self_attn, layer.mlp
                qkv, gate_up = linear([attn.q_proj, attn.k_proj, attn.v_proj]), linear([mlp.gate_proj, mlp.up_proj])
                made[index] = (qkv, linear([attn.o_proj]), gate_up, linear([mlp.down_proj]))
            layers.append(made[index])
        return LinearSet(layers)

    def _copy_bytes(self, fmt: str) -> int:
        """Bytes of a copy of every decoder linear in `fmt`."""
        per_weight = {formats_.FLOAT32: 4, formats_.BFLOAT16: 2, formats_.INT8: 1, formats_.INT4: 0.625}[fmt]
        layers = self.model.model.layers
        count = sum(m.in_features * m.out_features for layer in layers for m in _decoder_linears(layer))
        return int(count * per_weight)

    def _copy_fits(self, fmt: str) -> bool:
        """A copy beside weights held as stored only where it fits easily (a float32 model's copies are what the
        user's dtype and quantization asked for, as before)."""
        if not weights.formats_of(self.model) - {formats_.FLOAT32}:
            return True
        size = self._copy_bytes(fmt)
        fits = size <= COPY_MAX_BYTES and size < free_memory_bytes(self.device.type) * COPY_MEMORY_SHARE
        if not fits:
            log.info("no %s copy of the weights: %d MiB would not fit beside them", fmt, self._copy_bytes(fmt) >> 20)
        return fits

    def budget_layers(self) -> int:
        """How many layers the measurement touches (BUDGET_PARAMETERS, at most BUDGET_MAX_LAYERS)."""
        layer = self.model.model.layers[0]
        per_layer = sum(m.in_features * m.out_features for m in _decoder_linears(layer))
        wanted = -(-BUDGET_PARAMETERS // max(per_layer, 1))
        return max(1, min(len(self.layers), BUDGET_MAX_LAYERS, wanted))

    def _measure(self, native: str, candidates: list[str], progress) -> formats_.FormatChoice:
        """The fastest format per batch size, measured on the first budget_layers() layers (copies made for those
        only), or remembered for this machine and shape."""
        count = self.budget_layers()
        names = sorted([native, *candidates])
        # bfloat16 copies in blocks or in oneDNN's packing time differently: a choice measured on one is not the other's
        layout = bf16_blocks.use_blocks(progress) if formats_.BFLOAT16 in names else None
        key = formats_.machine_key(
            "layers", count, len(self.layers), self.hidden, self.q_size, self.kv_size, self.intermediate, names, layout
        )
        remembered = formats_.remembered(key, names)
        if remembered is not None:
            return remembered
        if progress is not None:
            progress(f"measuring weight formats ({', '.join(names)}) on {count} of {len(self.layers)} layers")
        passes = {native: self._pass(LinearSet(self.linears[native].layers[:count]))}
        for fmt in candidates:
            passes[fmt] = self._pass(self._formatted_linears(fmt, range(count)))
        return formats_.measure(passes, key=key, layers=f"{count} of {len(self.layers)} layers")

    def _pass(self, linears: LinearSet):
        """Every linear of the given layers once on `rows` rows (what the format measurement times)."""

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
        hidden = self.embed(input_ids)  # a quantized embedding dequantizes the rows it gathers
        if hidden.dtype != self.dtype:
            hidden = hidden.to(self.dtype)
        cos, sin = self.rotary(hidden.unsqueeze(0), positions.unsqueeze(0))
        self.last_format = self.choice.format_for(n)
        step = self.compiled.get(self.last_format) if tables is not None else None
        long_step = n >= quantized.UNPACK_FROM_ROWS and self._holds_quantized(self.last_format)
        if step is not None and long_step and not step.tiles_everywhere:
            # a prompt's rows where the compiled step keeps torch's int4/int8 kernels for some weights (they cost as
            # much per row at any batch size): the Python layers multiply them as unpacked bfloat16 tiles instead
            step = None
        self.last_compiled = False
        if step is not None and ctx.cache.storage.dtype in compiled_step.KV_DTYPES:
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

    def _holds_quantized(self, fmt: str) -> bool:
        """Whether this format's linears hold int8 weights, or int4 ones that can be unpacked here (quantized.py)."""
        if fmt not in self._quantized_formats:
            linears = self.linears.get(fmt)
            kinds = (quantized.Int8Linear,) + ((quantized.Int4Linear,) if quantized.int4_unpacker() else ())
            self._quantized_formats[fmt] = linears is not None and any(
                isinstance(part, kinds) for layer in linears.layers for m in layer for part in m.modules()
            )
        return self._quantized_formats[fmt]

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
            qk = qk * cos + rotate_half(qk) * sin
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

    def truncated(self, count: int) -> FastForward:
        """This forward over the first `count` layers only (the same modules; compiled steps of their own): what the
        fast path's check runs, so it costs a few layers whatever the model's size."""
        part = copy.copy(self)
        part.layers = self.layers[:count]
        part.linears = {fmt: LinearSet(linears.layers[:count]) for fmt, linears in self.linears.items()}
        part.compiled = {}
        if self.compiled:
            linears = {f: part.linears[f] for f in self.compiled}
            part.compiled, _reason = compiled_step.build_steps(part, linears, like=self.compiled)
        return part


@contextlib.contextmanager
def first_layers(model: nn.Module, count: int) -> Iterator[None]:
    """transformers' forward over the first `count` decoder layers (its models run layers[:num_hidden_layers])."""
    config = model.config
    previous = config.num_hidden_layers
    config.num_hidden_layers = count
    try:
        yield
    finally:
        config.num_hidden_layers = previous


_ATTR = "_studio_fast_forward"
_REJECTED = "_studio_fast_forward_rejected"
# prefill (longer than the compiled step's attention loops take), a chunk over cached pages (7 rows: among those
# where int4 weights may multiply int8 activations, tiles.vnni_rows), two decode steps
CHECK_STAGES = ((0, 17), (17, 7), (24, 1), (25, 1))
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 2e-2}  # of the logits' scale
# weight formats' own rounding: a sanity bound (a layout bug is off by the logits' whole scale), not an accuracy claim
FORMAT_TOLERANCE = {formats_.BFLOAT16: 5e-2, formats_.INT8: 0.15, formats_.INT4: 0.4}
ROUNDED_ROWS_TOLERANCE = 2e-2
# int4/int8 weights times int8 activations (compiled_step's vnni_rows, int8_rows) round each activation to 1/254
# of its group's largest: on a 7B-shape Q4_K_M file 2.5e-2 over 2 layers, where the kernels' bfloat16 rows gave 1.3e-2
INT8_ACTIVATIONS_TOLERANCE = 5e-2
# 16-bit KV rounds keys and values (relative 2^-8) where transformers' forward keeps them float32
KV_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3}


@dataclass(frozen=True)
class FastPathCheck:
    """The lean forward against a reference forward (transformers' own, or the engine modules' dense one), on a
    seeded random sequence through a scratch page pool."""

    passed: bool
    max_rel_error: float
    tolerance: float
    stages: str = (
        "prefill 17, chunked prefill 7 over cached pages, decode 2 over cached pages (seed 0), through the Python "
        "layers and the compiled step"
    )
    layers: str = ""  # which layers were compared: "2 of 30 layers"
    against: str = "transformers"  # or "the Python layers", where transformers can't run the modules as stored
    remembered: bool = False  # the verdict of an earlier start with the same weights, code and machine

    def describe(self) -> str:
        verdict = "agrees" if self.passed else "DISAGREES"
        where = f" on {self.layers}" if self.layers else ""
        when = "; checked at an earlier start of the same weights, code and machine" if self.remembered else ""
        return f"{verdict} with {self.against}{where} (max error {self.max_rel_error:.1e} of the logits' scale{when})"


def build(
    model: nn.Module,
    check: bool = True,
    formats: Sequence[str] = (),
    compiled: bool = True,
    kv_dtype: torch.dtype | None = None,
    progress: Callable[[str], None] | None = None,
    weights_identity: str | None = None,
) -> FastForward | None:
    """The lean forward for this model (built once per model and set of formats), or None (with the reason logged)
    when it doesn't apply or disagrees with the transformers forward. kv_dtype: the engine's KV cache's (the check
    runs through one like it). weights_identity: where the weights come from (check_memory.weights_identity): a check
    passed by an earlier start of the same weights, engine code, kernels and machine is not run again."""
    built = getattr(model, _ATTR, {})
    key = (tuple(formats), compiled)
    if key in built:
        return built[key]
    fast = None
    reason = unsupported_reason(model)
    if reason:
        log.info("lean forward off: %s", reason)
    else:
        fast = FastForward(model, formats=formats, compiled=compiled, progress=progress)
        if check:
            fast.check = _checked(model, fast, kv_dtype, progress, weights_identity)
            if not fast.check.passed:
                log.warning("lean forward %s; using the transformers forward", fast.check.describe())
                setattr(model, _REJECTED, fast.check)
                fast = None
    built[key] = fast
    setattr(model, _ATTR, built)
    return fast


def _checked(
    model: nn.Module,
    fast: FastForward,
    kv_dtype: torch.dtype | None,
    progress: Callable[[str], None] | None,
    weights_identity: str | None,
) -> FastPathCheck:
    """The check's verdict: remembered from an earlier start where everything it depends on is the same (the weights,
    the engine's code, the formats and kernels chosen, the KV dtype, the CPU and torch), else run now."""
    key = check_memory.key(
        weights_identity,
        [*fast.kinds, kv_dtype, CHECK_LAYERS, CHECK_STAGES, formats_.machine_key("fast-path check")],
    )
    fields = check_memory.remembered(key)
    if fields is not None:
        names = set(FastPathCheck.__dataclass_fields__) - {"remembered"}
        try:
            return FastPathCheck(**{name: fields[name] for name in names if name in fields}, remembered=True)
        except TypeError:  # an entry written by another version, without a field this one needs: checked again
            log.debug("a remembered fast-path check lacks fields; checking again")
    if progress is not None:
        progress(f"checking the fast path on {min(CHECK_LAYERS, len(fast.layers))} layers")
    check = check_against_transformers(model, fast, kv_dtype)
    check_memory.remember(key, dataclasses.asdict(check))
    return check


def _int8_activations(fast: FastForward) -> bool:
    """Some compiled step multiplies int4 or int8 weights with int8 activations for some row counts."""
    return any(getattr(step, "int8_activations", False) for step in fast.compiled.values())


def rejected_check(model: nn.Module) -> FastPathCheck | None:
    """The failed check that turned the lean forward off for this model, if one did."""
    return getattr(model, _REJECTED, None)


def check_against_transformers(
    model: nn.Module, fast: FastForward, kv_dtype: torch.dtype | None = None, layers: int = CHECK_LAYERS
) -> FastPathCheck:
    """Both forwards over the first `layers` layers and a seeded random sequence of 26 tokens (a fixed budget
    whatever the model's size): the lean one step by step through a scratch page pool (prefill, a chunk over cached
    pages, decodes over cached pages; through its Python layers, and again with the compiled step where there is
    one), the reference in one pass over the same modules (transformers' forward, or for the engine's own modules
    their dense one). Where the reference can't run the modules as stored, the compiled step is checked against the
    Python layers."""
    count = min(layers, len(fast.layers))
    part = fast.truncated(count)
    device = fast.device
    kv_dtype = kv_dtype or fast.dtype
    total = sum(CHECK_STAGES[-1])
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (total,), generator=generator).tolist()
    reference = None
    own = isinstance(model, llama_family.LlamaFamilyForCausalLM)  # its reference is its own dense forward
    try:
        mode = contextlib.nullcontext() if own else transformers_mode(model)
        with torch.inference_mode(), mode, first_layers(model, count):
            reference = model(input_ids=torch.tensor([ids], device=device)).logits[0].float()
    except Exception as exc:  # modules as stored that transformers' forward can't call (dtype mismatches...)
        log.info("fast path checked against its own Python layers: the reference forward failed (%s)", exc)
    page_size = 4
    worst = 0.0
    runs = []
    for compiled in (False, True) if part.compiled else (False,):
        cache = PagedKVCache(count, fast.kv_heads, fast.head_dim, total // page_size + 1, page_size, kv_dtype, device)
        pages = tuple(reversed(range(cache.num_pages)))  # pages out of order, as a busy pool hands them out
        outputs = []
        # the head as stored: its twin (chosen by a timing) gives the logits outside the leaders its own rounding
        with torch.inference_mode(), part.lm_head.untimed():
            for start, count_ in CHECK_STAGES:
                chunk = ChunkPlan(tuple(ids[start : start + count_]), start, pages, SamplingRow(SamplingParams(), 0))
                batch = pack(StepPlan((chunk,)), cache, tables=compiled)
                # the greedy head: a quantized head's every-logit exact pass dequantizes it whole, which would cost
                # more than the layers checked (the head is the model's own module in both forwards)
                ids_, positions, keep = batch.input_ids, batch.positions, batch.keep
                ours = part(batch.context, ids_, positions, keep, CANDIDATES, tables=batch.tables)
                outputs.append(ours.float()[0])
        runs.append(outputs)
    expected_rows = (
        [reference[start + count_ - 1] for start, count_ in CHECK_STAGES] if reference is not None else runs[0]
    )
    for outputs in runs if reference is not None else runs[1:]:
        for ours, expected in zip(outputs, expected_rows, strict=True):
            scale = expected.abs().max().clamp_min(1e-6)
            worst = max(worst, float((ours - expected).abs().max() / scale))
    # lower-precision formats (chosen for some batch sizes) and a 16-bit KV cache are judged by their own rounding
    tolerance = max(
        TOLERANCE.get(weights.activation_dtype(model), 5e-2),
        # weights stored in 16 or fewer bits take bfloat16 rows: sums in another order round to other neighbours
        ROUNDED_ROWS_TOLERANCE if set(fast.stored_format.split(" + ")) - {formats_.FLOAT32} else 0.0,
        *(FORMAT_TOLERANCE.get(f, 0.0) for f in fast.choice.formats - {fast.stored_format}),
        KV_TOLERANCE.get(kv_dtype, 0.0),
        INT8_ACTIVATIONS_TOLERANCE if _int8_activations(part) else 0.0,
    )
    return FastPathCheck(
        passed=worst < tolerance,
        max_rel_error=worst,
        tolerance=tolerance,
        layers=f"{count} of {len(fast.layers)} layers",
        against=(
            ("the dense reference forward" if own else "transformers")
            if reference is not None
            else "the Python layers (the reference forward can't run them)"
        ),
    )
