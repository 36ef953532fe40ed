"""Headless inference engine: model loading, paged KV cache, continuous batching. Never imports Qt.

The public API is exported lazily, so `import engine` (or a torch-free name like SamplingParams) does not load
torch; Engine, EngineThread and start_engine load it when first used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "SamplingParams": "engine.types",
    "TokenEvent": "engine.types",
    "FinishReason": "engine.types",
    "RequestStats": "engine.types",
    "RequestHandle": "engine.handle",
    "RequestResult": "engine.handle",
    "StudioError": "engine.errors",
    "InvalidRequestError": "engine.errors",
    "PromptTooLongError": "engine.errors",
    "ModelNotFoundError": "engine.errors",
    "ModelFormatError": "engine.errors",
    "UnsupportedOptionError": "engine.errors",
    "EngineConfig": "engine.core.config",
    "Engine": "engine.core.engine",
    "EngineThread": "engine.core.engine_thread",
    "EngineOptions": "engine.launch",
    "start_engine": "engine.launch",
    "LoadOptions": "engine.load.options",
    "load_model": "engine.load.loader",
}

__all__ = [  # noqa: RUF022  grouped as in _EXPORTS
    "SamplingParams",
    "TokenEvent",
    "FinishReason",
    "RequestStats",
    "RequestHandle",
    "RequestResult",
    "StudioError",
    "InvalidRequestError",
    "PromptTooLongError",
    "ModelNotFoundError",
    "ModelFormatError",
    "UnsupportedOptionError",
    "EngineConfig",
    "Engine",
    "EngineThread",
    "EngineOptions",
    "start_engine",
    "LoadOptions",
    "load_model",
]

if TYPE_CHECKING:
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine
    from engine.core.engine_thread import EngineThread
    from engine.errors import (
        InvalidRequestError,
        ModelFormatError,
        ModelNotFoundError,
        PromptTooLongError,
        StudioError,
        UnsupportedOptionError,
    )
    from engine.handle import RequestHandle, RequestResult
    from engine.launch import EngineOptions, start_engine
    from engine.load.loader import load_model
    from engine.load.options import LoadOptions
    from engine.types import FinishReason, RequestStats, SamplingParams, TokenEvent


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
