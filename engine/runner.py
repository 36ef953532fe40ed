"""Builds the packed batch (all scheduled tokens in one row) and runs the Hugging Face model over the pages."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from engine import attention, kernels
from engine.attention import PagedKVCache, PrefillSlice, StepContext
from engine.errors import UnsupportedOptionError
from engine.scheduler import ScheduledChunk


@dataclass
class ForwardResult:
    logits: torch.Tensor  # [sampling chunks, vocab], float32
    sampling_chunks: list[ScheduledChunk]
    forward_s: float


def prepare_model(model: torch.nn.Module) -> None:
    """Switch the model's attention to the paged implementation, or say why this model can't use it."""
    name = type(model).__name__
    if not getattr(model, "_supports_attention_backend", False):
        raise UnsupportedOptionError(
            f"{name} does not dispatch attention through transformers' AttentionInterface, so the paged engine "
            "cannot run it; pick a Llama, Mistral, Qwen, Gemma or Phi-3 style model"
        )
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(text_config, "attn_logit_softcapping", None):
        raise UnsupportedOptionError(f"{name} uses attention logit soft-capping, which the paged engine lacks")
    attention.register()
    model.set_attn_implementation(attention.ATTENTION_NAME)
    if model.config._attn_implementation != attention.ATTENTION_NAME:
        # frozen installs have no module source for transformers' heuristic check; set it directly
        model.config._attn_implementation_internal = attention.ATTENTION_NAME


@contextlib.contextmanager
def transformers_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run the model exactly as transformers built it (its own SDPA attention, original modules): for
    baselines and golden references. The engine's attention and kernels come back afterwards."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with kernels.original_modules(model):
            yield
    finally:
        model.set_attn_implementation(previous)
        if model.config._attn_implementation != previous:
            model.config._attn_implementation_internal = previous


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cache: PagedKVCache, fast=None) -> None:
        self.model = model
        self.fast = fast  # engine.fast_forward.FastForward, or None for the transformers forward
        self.cache = cache
        self.device = cache.storage.device
        self.page_size = cache.page_size

    @torch.inference_mode()
    def execute(self, chunks: list[ScheduledChunk]) -> ForwardResult:
        ps = self.page_size
        # Single-token chunks (decodes) go first: they share one batched attention call.
        decodes = [c for c in chunks if c.num_tokens == 1]
        prefills = [c for c in chunks if c.num_tokens > 1]
        ordered = decodes + prefills

        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for chunk in ordered:
            tokens = chunk.request.all_ids
            table = chunk.request.page_table
            for pos in range(chunk.start, chunk.start + chunk.num_tokens):
                input_ids.append(tokens[pos])
                positions.append(pos)
                slots.append(table[pos // ps] * ps + pos % ps)

        decode_index = decode_lens = None
        max_pages = 0
        if decodes:
            lens = [c.start + 1 for c in decodes]
            max_pages = math.ceil(max(lens) / ps)
            flat: list[int] = []
            for chunk, length in zip(decodes, lens, strict=True):
                pages = chunk.request.page_table[: math.ceil(length / ps)]
                flat.extend(pages)
                flat.extend([pages[0]] * (max_pages - len(pages)))  # padding, masked out
            decode_index = torch.tensor(flat, dtype=torch.long, device=self.device)
            decode_lens = torch.tensor(lens, dtype=torch.long, device=self.device)

        slices: list[PrefillSlice] = []
        row = len(decodes)
        for chunk in prefills:
            context = chunk.start + chunk.num_tokens
            page_index = None
            if chunk.start:
                page_index = torch.tensor(
                    chunk.request.page_table[: math.ceil(context / ps)], dtype=torch.long, device=self.device
                )
            slices.append(PrefillSlice(row, chunk.num_tokens, context, page_index))
            row += chunk.num_tokens

        sampling = [c for c in ordered if c.samples]
        keep: list[int] = []
        row = 0
        for chunk in ordered:
            row += chunk.num_tokens
            if chunk.samples:
                keep.append(row - 1)

        context = StepContext(
            cache=self.cache,
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=self.device),
            num_decode=len(decodes),
            decode_page_index=decode_index,
            decode_context_lens=decode_lens,
            decode_max_pages=max_pages,
            prefills=slices,
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        keep_index = torch.tensor(keep, dtype=torch.long, device=self.device)
        started = time.perf_counter()
        if self.fast is not None:
            logits = self.fast(context, ids, pos, keep_index).float()
        else:
            with attention.step_context(context):
                output = self.model(
                    input_ids=ids.unsqueeze(0),
                    position_ids=pos.unsqueeze(0),
                    use_cache=False,
                    logits_to_keep=keep_index,
                )
            logits = output.logits[0].float()
        return ForwardResult(logits=logits, sampling_chunks=sampling, forward_s=time.perf_counter() - started)
