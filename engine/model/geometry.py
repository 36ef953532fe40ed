"""The attention geometry of a model read from its config: layers, KV heads, head size, and KV bytes per token."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionGeometry:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def kv_bytes_per_token(self, element_size: int) -> int:
        """Keys and values of every layer for one token."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * element_size


def attention_geometry(config) -> AttentionGeometry:
    """From a transformers config (its text part, for multimodal configs)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    return AttentionGeometry(
        num_layers=text.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
    )
