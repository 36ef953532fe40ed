"""The fast path's check is remembered per weights, engine code and machine: a later start of the same weights skips
it; new weights, a rewritten file, another KV dtype or a failed check check again."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.load.loader import load_model
from engine.load.options import LoadOptions
from engine.model import check_memory, fast_forward
from tests.helpers import make_tiny_llama


@pytest.fixture
def store(tmp_path, monkeypatch):
    path = tmp_path / "fast-path-checks.json"
    monkeypatch.setattr(check_memory, "_store", lambda: path)
    return path


@pytest.fixture
def checks(monkeypatch) -> list[torch.dtype | None]:
    """The KV dtype of every check that really ran."""
    runs: list[torch.dtype | None] = []
    real = fast_forward.check_against_transformers

    def counted(model, fast, kv_dtype=None, *args, **kwargs):
        runs.append(kv_dtype)
        return real(model, fast, kv_dtype, *args, **kwargs)

    monkeypatch.setattr(fast_forward, "check_against_transformers", counted)
    return runs


def start(folder, kv_dtype: torch.dtype | None = None) -> Engine:
    """A new start: the model loaded again (a new object, as a new process has), then its engine."""
    loaded = load_model(str(folder), LoadOptions(dtype="float32"))
    if kv_dtype is not None:
        loaded = dataclasses.replace(loaded, kv_dtype=kv_dtype)
    return Engine(loaded, EngineConfig(kv_pages=16))


def test_a_later_start_of_the_same_weights_reuses_the_check_and_a_rewritten_file_checks_again(
    tmp_path, store, checks
) -> None:
    folder = make_tiny_llama(tmp_path / "model")
    first = start(folder)
    assert len(checks) == 1 and first.runner.fast is not None
    assert "earlier start" not in first.runtime_record()["fast_path_check"]
    second = start(folder)
    assert len(checks) == 1  # not run again
    record = second.runtime_record()["fast_path_check"]
    assert record.startswith("agrees") and "checked at an earlier start of the same weights, code and machine" in record
    assert second.runner.fast.check.max_rel_error == first.runner.fast.check.max_rel_error
    weights = next(folder.glob("*.safetensors"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # written again, same size
    start(folder)
    assert len(checks) == 2


def test_other_weights_or_another_kv_dtype_check_again(tmp_path, store, checks) -> None:
    start(make_tiny_llama(tmp_path / "a", seed=1))
    start(make_tiny_llama(tmp_path / "b", seed=2))
    assert len(checks) == 2
    start(tmp_path / "a", kv_dtype=torch.bfloat16)
    assert len(checks) == 3 and checks[-1] == torch.bfloat16


def test_another_transformers_checks_again(store, monkeypatch) -> None:
    before = check_memory.key("weights", ["kinds"])
    monkeypatch.setattr(check_memory, "library_versions", lambda: ("transformers 99.0", "gguf 1", "numpy 2"))
    assert check_memory.key("weights", ["kinds"]) != before


def test_only_a_passed_recent_check_is_remembered(store, monkeypatch) -> None:
    key = check_memory.key("weights", ["kinds"])
    assert key is not None and check_memory.key(None, ["kinds"]) is None  # no source: nothing remembered
    check_memory.remember(key, {"passed": False, "max_rel_error": 1.0})
    assert check_memory.remembered(key) is None  # a failed check is run again at every start
    check_memory.remember(key, {"passed": True, "max_rel_error": 0.01})
    assert check_memory.remembered(key)["max_rel_error"] == 0.01
    later = check_memory._now() + (check_memory.KEEP_DAYS + 1) * 86400
    monkeypatch.setattr(check_memory, "_now", lambda: later)
    assert check_memory.remembered(key) is None


def test_an_unreadable_store_or_source_only_means_checking_again(tmp_path, store) -> None:
    store.write_text("{not json")
    assert check_memory.remembered(check_memory.key("weights", [])) is None
    check_memory.remember(check_memory.key("weights", []), {"passed": True})
    assert check_memory.remembered(check_memory.key("weights", [])) is not None  # the broken store was replaced
    assert check_memory.weights_identity(tmp_path / "gone.gguf", None) is None
    assert check_memory.weights_identity(None, None) is None


def test_a_remembered_entry_without_the_fields_a_check_needs_is_checked_again(tmp_path, store, checks) -> None:
    folder = make_tiny_llama(tmp_path / "model")
    start(folder)
    entries = json.loads(store.read_text())
    store.write_text(
        json.dumps({key: {"passed": True, "checked_at": entry["checked_at"]} for key, entry in entries.items()})
    )
    assert start(folder).runner.fast is not None and len(checks) == 2
