"""`bench --via window`: the real main window streams every request of a workload in its own tab, and the result
counts each token the window showed (the tiny random model: the same tokens as the engine thread's run)."""

from __future__ import annotations

import tempfile

import pytest

from app.bench.window_path import run_window
from engine.bench.engine_run import run_engine
from engine.bench.workloads import BenchRequest, Workload, conversation
from engine.core.config import EngineConfig
from engine.core.prompts import encode_prompt
from engine.load.loader import load_model
from engine.load.options import LoadOptions

TOKENS = 12


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    # float32 pinned: the two paths batch the requests differently, and only the exact format makes a token
    # independent of what shares its step, on every CPU (a bfloat16 choice would make the comparison depend on it)
    return load_model(str(tiny_model_dir), LoadOptions(dtype="float32"))


def _workload(loaded, count: int) -> Workload:
    requests = []
    for index in range(count):
        messages = conversation(f"Question number {index}: what is {index} plus {index}?")
        prompt = encode_prompt(loaded.tokenizer, messages=messages)
        requests.append(BenchRequest(prompt, TOKENS, messages=messages))
    return Workload("tabs", "a few chats, one tab each", requests)


def test_the_window_streams_every_request_in_its_own_tab_and_counts_the_tokens_it_showed(
    qapp, studio_home, tiny, tmp_path, monkeypatch
):
    config = EngineConfig(kv_pages=64, page_size=4)
    workload = _workload(tiny, 3)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = run_window(tiny, workload, config)
    assert list(tmp_path.iterdir()) == []  # the run's chats and settings went with it
    assert result.failed is None
    assert [len(t.token_times) for t in result.timings] == [TOKENS] * 3
    assert all(len(tokens) == TOKENS for tokens in result.outputs)
    assert result.extra["via"] == "window"
    assert 0.0 <= result.extra["ui_thread_busy"] <= 1.0
    assert result.extra["keystrokes"] >= 0
    # greedy and exact-length, as the engine thread runs them: the window's tabs got the same tokens
    thread = run_engine(tiny, workload, config)
    assert result.outputs == thread.outputs
