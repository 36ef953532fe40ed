"""Which GGML type each tensor of a synthetic GGUF file gets: llama.cpp's Q4_K_M mix (the rule of its
llama-quant.cpp, for a dense model without experts) or all Q4_1 (the embedded model's format)."""

from __future__ import annotations

import re

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

Q = GGMLQuantizationType
MIXES = {"q4_k_m": LlamaFileType.MOSTLY_Q4_K_M, "q4_1": LlamaFileType.MOSTLY_Q4_1}
# llama.cpp's fallback when a row is not a whole number of 256-value super-blocks (Qwen2.5-0.5B's 896)
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get Q6_K in Q4_K_M: the first and last eighth,
    and every third layer between (about half of them)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _fits(qtype: GGMLQuantizationType, cols: int) -> GGMLQuantizationType:
    if cols % GGML_QUANT_SIZES[qtype][0] == 0:
        return qtype
    return FALLBACK[qtype]


def q4_k_m_type(name: str, cols: int, layers: int, tied: bool) -> GGMLQuantizationType:
    """The type llama-quantize gives a 2-D weight `name` (GGUF name) whose rows hold `cols` values."""
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        # the output matrix (or the embedding that doubles as it) gets Q6_K, Q8_0 if rows don't fit K-quants
        return Q.Q6_K if cols % 256 == 0 else Q.Q8_0
    match = re.match(r"blk\.(\d+)\.(attn_v|ffn_down)\.weight$", name)
    if match and use_more_bits(int(match.group(1)), layers):
        return _fits(Q.Q6_K, cols)
    return _fits(Q.Q4_K, cols)


def tensor_type(mix: str, name: str, dims: tuple[int, ...], layers: int, tied: bool) -> GGMLQuantizationType:
    """dims as torch orders them (rows, cols); 1-D tensors (norms, biases) stay float32, as llama.cpp keeps them."""
    if len(dims) == 1:
        return Q.F32
    if mix == "q4_1":
        return Q.Q4_1
    if mix == "q4_k_m":
        return q4_k_m_type(name, dims[-1], layers, tied)
    raise ValueError(f"unknown mix {mix!r}; choose from {', '.join(MIXES)}")
