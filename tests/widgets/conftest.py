"""Widget fixtures: the tiny random Llama, loaded once, for dashboard tests that run a real engine."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_loaded_for_widgets(tiny_model_dir):
    from engine.load.loader import load_model

    return load_model(str(tiny_model_dir))
