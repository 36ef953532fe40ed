"""Engine fixtures: the tiny random Llama, loaded once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir):
    from engine.load.loader import load_model
    from engine.load.options import LoadOptions

    return load_model(str(tiny_model_dir), LoadOptions(dtype="float32"))  # token-exact checks pin float32


@pytest.fixture
def make_engine(tiny_loaded):
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine

    def build(**config) -> Engine:
        config.setdefault("kv_pages", 64)
        config.setdefault("page_size", 4)
        return Engine(tiny_loaded, EngineConfig(**config))

    return build
