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
    hidden_size: int = 0
    intermediate_size: int = 0
    num_heads: int = 0
    vocab_size: int = 0
    tied_embeddings: bool = True
    #: built from the engine's own modules (llama_family.py) where a GGUF file is loaded: no transformers modeling code
    engine_modules: bool = False

    def kv_bytes_per_token(self, element_size: int) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * element_size


@dataclass(frozen=True)
class MemoryEstimate:
    shape: ModelShape
    dtype: str
    quantization: str
    weight_bytes: int
    kv_bytes_per_token: int
    #: about this much more for the engine's own copies of the weights in faster formats (CPU: prepacked float32,
    #: bfloat16, int8/int4 where chosen); the model's weights stay for the reference path
    engine_copy_bytes: int = 0
    #: what the chosen format does to decode speed here, measured on this model's layer shapes (or "")
    decode_note: str = ""
    #: the process around the weights: the libraries, the tokenizer, a step's activations and logits
    runtime_bytes: int = 0
    #: what each stored tensor becomes ("int4 (Q4_K as stored): 217 tensors; int8 (Q6_K requantized per row): ...")
    weight_formats: str = ""
    kv_dtype: str = "float32"

    def kv_tokens_for(self, kv_budget_bytes: int) -> int:
        return max(0, kv_budget_bytes // self.kv_bytes_per_token)

    def total_bytes(self, kv_budget_bytes: int) -> int:
        """The resident memory of a studio process serving this model with this KV budget."""
        return self.weight_bytes + self.engine_copy_bytes + kv_budget_bytes + self.runtime_bytes


def format_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
