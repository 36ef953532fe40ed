"""The suite depends on nothing outside its run: its own cache folder (no compiled step, measured formats or
converted model from an earlier run or the user's studio), its own data folder, and no model hub."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def test_the_suite_has_a_cache_and_a_home_of_its_own(tmp_path_factory) -> None:
    from engine.paths import cache_dir, data_dir

    run_folder = tmp_path_factory.getbasetemp()
    assert cache_dir().is_relative_to(run_folder) and data_dir().is_relative_to(run_folder)
    assert cache_dir() != Path(platformdirs.user_cache_dir("inference-studio"))


def test_the_suite_is_offline_for_the_model_hub() -> None:
    import huggingface_hub.constants

    assert os.environ["HF_HUB_OFFLINE"] == "1" and huggingface_hub.constants.HF_HUB_OFFLINE
