"""A lean forward pass for Llama-family decoders (Llama, SmolLM, Mistral, Qwen2) over the paged cache.

The transformers modeling code spends about 0.6 ms per layer in Python and module dispatch, which at
one sequence is a third of a decode step on a CPU. This module runs the same computation (the model's own
weights, its own rotary embedding module, the same float operations) as a flat loop of tensor calls, with
QKV and gate/up fused and, on CPU float32, oneDNN-prepacked weights. It is checked against the
transformers forward when it is built; any other architecture, or a mismatch, keeps the transformers path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.model import attention, kernels
from engine.model.attention import PagedKVCache, StepContext
from engine.model.geometry import attention_geometry
from engine.model.reference import transformers_mode

log = logging.getLogger(__name__)

SUPPORTED_TYPES = {"llama", "mistral", "qwen2"}


@dataclass
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: nn.Module
    o_proj: nn.Module
    gate_up: nn.Module
    down: nn.Module
    sliding_window: int | None


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

    def __init__(self, model: nn.Module, pack: bool | None = None) -> None:
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
        head = model.get_output_embeddings()
        self.lm_head = kernels.PackedLinear(head.weight, head.bias) if pack else head
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = kernels.fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj], pack)
            gate_up = kernels.fuse_linears([mlp.gate_proj, mlp.up_proj], pack)
            self.layers.append(
                _Layer(
                    input_norm=layer.input_layernorm.weight,
                    post_norm=layer.post_attention_layernorm.weight,
                    qkv=qkv,
                    o_proj=kernels.PackedLinear(attn.o_proj.weight, None) if pack else attn.o_proj,
                    gate_up=gate_up,
                    down=kernels.PackedLinear(mlp.down_proj.weight, None) if pack else mlp.down_proj,
                    sliding_window=_sliding_window(config, attn),
                )
            )
        self.intermediate = inner.layers[0].mlp.gate_proj.out_features
        self.norm_shape = (self.hidden,)
        self.kinds = ["lean Llama-family forward", "fused QKV", "fused gate/up MLP", "fused RMSNorm"]
        if pack:
            self.kinds.append("oneDNN prepacked linears")

    def __call__(self, ctx: StepContext, input_ids: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor):
        n = input_ids.shape[0]
        hidden = self.embed(input_ids)
        cos, sin = self.rotary(hidden.unsqueeze(0), positions.unsqueeze(0))
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [N, 1, dim], broadcast over heads
        norm_shape, eps = self.norm_shape, self.eps
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        for index, layer in enumerate(self.layers):
            x = F.rms_norm(hidden, norm_shape, layer.input_norm, eps)
            qk, v = layer.qkv(x).split((self.q_size + self.kv_size, self.kv_size), dim=-1)
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
            hidden = hidden + layer.o_proj(attended.view(n, self.q_size))
            x = F.rms_norm(hidden, norm_shape, layer.post_norm, eps)
            gate, up = layer.gate_up(x).split(self.intermediate, dim=-1)
            hidden = hidden + layer.down(F.silu(gate) * up)
        hidden = F.rms_norm(hidden.index_select(0, keep), norm_shape, self.final_norm, eps)
        return self.lm_head(hidden)


_ATTR = "_studio_fast_forward"


def build(model: nn.Module, check: bool = True) -> FastForward | None:
    """The lean forward for this model (built once per model), or None (with the reason logged) when it
    doesn't apply or disagrees with the transformers forward."""
    if hasattr(model, _ATTR):
        return getattr(model, _ATTR)
    fast = None
    reason = unsupported_reason(model)
    if reason:
        log.info("lean forward off: %s", reason)
    else:
        fast = FastForward(model)
        if check and not _agrees(model, fast):
            log.warning("lean forward disagrees with transformers on this model; using the transformers forward")
            fast = None
    setattr(model, _ATTR, fast)
    return fast


def _agrees(model: nn.Module, fast: FastForward) -> bool:
    """Both forwards over a short random prompt, through a scratch page pool: same logits."""
    device = next(model.parameters()).device
    tokens = torch.randint(0, model.config.vocab_size, (12,), device=device)
    positions = torch.arange(12, device=device)
    cache = PagedKVCache(len(fast.layers), fast.kv_heads, fast.head_dim, 1, 16, next(model.parameters()).dtype, device)
    ctx = StepContext(
        cache=cache,
        slot_mapping=positions,
        num_decode=0,
        decode_page_index=None,
        decode_context_lens=None,
        decode_max_pages=0,
        prefills=[attention.PrefillSlice(0, 12, 12, None)],
    )
    with torch.inference_mode():
        ours = fast(ctx, tokens, positions, torch.tensor([11], device=device)).float()
        with transformers_mode(model):
            theirs = model(input_ids=tokens.unsqueeze(0)).logits[0, -1:].float()
    scale = theirs.abs().max().clamp_min(1e-6)
    return bool(((ours - theirs).abs().max() / scale) < 1e-3)
