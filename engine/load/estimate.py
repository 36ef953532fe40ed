"""Torch-free results of the memory estimate (what the model picker shows), and byte counts for people."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about a model, read from its config alone."""

    architecture: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    context_length: int
    parameters: int
    quantizable_parameters: int  # nn.Linear weights inside the decoder (not embeddings or the LM head)
    quantizable_rows: int


@dataclass(frozen=True)
class MemoryEstimate:
    shape: ModelShape
    dtype: str
    quantization: str
    weight_bytes: int
    kv_bytes_per_token: int

    def kv_tokens_for(self, kv_budget_bytes: int) -> int:
        return max(0, kv_budget_bytes // self.kv_bytes_per_token)

    def total_bytes(self, kv_budget_bytes: int) -> int:
        return self.weight_bytes + kv_budget_bytes


def format_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
