"""The Llama-family decoder (Llama, Mistral, Qwen2) as plain torch modules under transformers' own attribute names,
for files held as stored: importing transformers' modeling code (torch._dynamo, kernels hub, masking) is about 2 s
of a start on 2 cores, and the lean forward runs these models without it. transformers' classes are built around
the same modules only where its forward is needed (a rejected fast path, the bench's baselines): transformers_model."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

# the transformers class each model type has (the name the studio shows)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
MODEL_TYPES = set(ARCHITECTURES)
# rope types whose frequencies are fixed at build time (dynamic and longrope rescale with the sequence: transformers)
STATIC_ROPE_TYPES = {"default", "linear", "llama3", "yarn"}
_TRANSFORMERS = "_studio_transformers_model"


def _linear(inputs: int, outputs: int, bias: bool) -> nn.Linear:
    """An nn.Linear whose parameters are on the meta device, uninitialised: initialising a meta tensor goes through
    torch's reference ops, whose first call imports torch._dynamo (0.8 s of a start). The loader fills it."""
    module = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(module)
    module.in_features, module.out_features = inputs, outputs
    module.weight = _meta(outputs, inputs)
    module.bias = _meta(outputs) if bias else None
    return module


def _embedding(count: int, size: int, padding: int | None) -> nn.Embedding:
    return nn.Embedding(count, size, padding, _weight=_meta(count, size), _freeze=True)


def _meta(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device="meta"), requires_grad=False)


def unsupported_reason(config) -> str | None:
    """Why this config needs transformers' modules (None when these classes build it)."""
    if getattr(config, "model_type", None) not in MODEL_TYPES:
        return f"architecture {getattr(config, 'model_type', None)!r}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    rope = _rope_parameters(config)
    if rope.get("rope_type", "default") not in STATIC_ROPE_TYPES:
        return f"rope type {rope.get('rope_type')!r}"
    biased = getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False)
    if config.model_type == "llama" and biased:
        # biases on o_proj or down_proj: the lean forward refuses them, so transformers' forward runs them anyway
        return "biases on output projections"
    return None


def _rope_parameters(config) -> dict:
    return dict(getattr(config, "rope_parameters", None) or {})


class RMSNorm(nn.Module):
    """transformers' Llama RMSNorm, operation for operation."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = _meta(size)
        self.variance_epsilon = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden.to(dtype)


class RotaryEmbedding(nn.Module):
    """transformers' rotary embedding for the static rope types: (x, position_ids) -> cos, sin in x's dtype."""

    def __init__(self, config) -> None:
        super().__init__()
        rope = _rope_parameters(config)
        kind = rope.get("rope_type", "default")
        if kind == "default":
            dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            base = rope["rope_theta"]
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            self.attention_scaling = 1.0
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"))
        self.inv_freq = nn.Buffer(inv_freq.float(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The rotary's pairing of each half of a head with the other (transformers' rotate_half); the lean forward
    uses it too."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config, index: int) -> None:
        super().__init__()
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.num_heads, self.num_kv_heads = heads, kv_heads
        self.scaling = self.head_dim**-0.5
        hidden = config.hidden_size
        if config.model_type == "qwen2":  # biases on q, k, v; a window on the layers the config marks sliding
            qkv_bias, o_bias = True, False
            kinds = getattr(config, "layer_types", None)
            sliding = kinds is not None and kinds[index] == "sliding_attention"
            self.sliding_window = config.sliding_window if sliding else None
        elif config.model_type == "llama":
            qkv_bias = o_bias = bool(getattr(config, "attention_bias", False))
        else:
            qkv_bias = o_bias = False
        self.q_proj = _linear(hidden, heads * self.head_dim, qkv_bias)
        self.k_proj = _linear(hidden, kv_heads * self.head_dim, qkv_bias)
        self.v_proj = _linear(hidden, kv_heads * self.head_dim, qkv_bias)
        self.o_proj = _linear(heads * self.head_dim, hidden, o_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, window: int | None) -> torch.Tensor:
        """x [T, hidden] of one sequence from position 0: dense causal attention (the reference, not a fast path)."""
        count = x.shape[0]
        q = self.q_proj(x).view(count, self.num_heads, self.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(count, self.num_kv_heads, self.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(count, self.num_kv_heads, self.head_dim).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
        query = torch.arange(count, device=x.device)[:, None]
        key = torch.arange(count, device=x.device)[None, :]
        mask = key <= query
        if window is not None:
            mask &= query - key < window
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
        return self.o_proj(out.transpose(0, 1).reshape(count, -1))


class MLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False)) if config.model_type == "llama" else False
        self.gate_proj = _linear(config.hidden_size, config.intermediate_size, bias)
        self.up_proj = _linear(config.hidden_size, config.intermediate_size, bias)
        self.down_proj = _linear(config.intermediate_size, config.hidden_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config, index: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, index)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Decoder(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.embed_tokens = _embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(config, index) for index in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)


class LlamaFamilyForCausalLM(nn.Module):
    """The decoder and its LM head, shaped as transformers' XForCausalLM (same parameter names), built on the meta
    device for the loader to fill, with a plain dense forward that is the fast path's reference:
    forward(input_ids [1, T]) -> .logits [1, T, vocab]."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.architecture = ARCHITECTURES[config.model_type]
        self.model = Decoder(config)
        self.lm_head = _linear(config.hidden_size, config.vocab_size, False)
        from transformers.generation.configuration_utils import GenerationConfig

        self.generation_config = GenerationConfig.from_model_config(config)  # the end tokens the config names

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, module: nn.Module) -> None:
        self.model.embed_tokens = module

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, module: nn.Module) -> None:
        self.lm_head = module

    def tie_weights(self) -> None:
        if getattr(self.config, "tie_word_embeddings", False) and isinstance(self.lm_head, nn.Linear):
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, **_unused) -> SimpleNamespace:
        ids = input_ids[0]
        hidden = self.model.embed_tokens(ids)
        positions = torch.arange(ids.shape[0], device=ids.device)
        cos, sin = self.model.rotary_emb(hidden, positions)
        mistral_window = getattr(self.config, "sliding_window", None) if self.config.model_type == "mistral" else None
        for layer in self.model.layers[: self.config.num_hidden_layers]:  # as transformers' (the check shortens it)
            attn = layer.self_attn
            window = getattr(attn, "sliding_window", mistral_window)
            hidden = hidden + attn(layer.input_layernorm(hidden), cos, sin, window)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return SimpleNamespace(logits=self.lm_head(self.model.norm(hidden)).unsqueeze(0))


def transformers_model(model: nn.Module) -> nn.Module:
    """transformers' own model class around this model's modules (built once, sharing every weight), or the model
    itself when it is transformers'. Costs the import of transformers' modeling code (seconds)."""
    if not isinstance(model, LlamaFamilyForCausalLM):
        return model
    built = model.__dict__.get(_TRANSFORMERS)
    if built is not None:
        return built
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    dtype = next((p.dtype for p in model.model.norm.parameters()), torch.float32)
    with init_empty_weights():
        built = AutoModelForCausalLM.from_config(model.config, dtype=dtype)
    built.model.embed_tokens = model.model.embed_tokens
    built.lm_head = model.lm_head
    built.model.norm.weight = model.model.norm.weight
    for ours, theirs in zip(model.model.layers, built.model.layers, strict=True):
        for part in ("self_attn", "mlp"):
            for name, module in getattr(ours, part).named_children():
                setattr(getattr(theirs, part), name, module)
        theirs.input_layernorm.weight = ours.input_layernorm.weight
        theirs.post_attention_layernorm.weight = ours.post_attention_layernorm.weight
    built.to(model.model.norm.weight.device)
    built.eval()
    built.requires_grad_(False)
    model.__dict__[_TRANSFORMERS] = built  # not a submodule: the weights are counted once
    log.info("built transformers' %s around the model's modules", type(built).__name__)
    return built
