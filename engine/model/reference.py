"""The model as transformers built it (its own SDPA attention and modules): for baselines, golden references and
the fast path's check. The engine's attention and kernels come back afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from engine.model import patches


@contextlib.contextmanager
def transformers_mode(model: torch.nn.Module) -> Iterator[None]:
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with patches.original_modules(model):
            yield
    finally:
        model.set_attn_implementation(previous)
        if model.config._attn_implementation != previous:
            model.config._attn_implementation_internal = previous
