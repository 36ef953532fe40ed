"""The Qt-free domain: a reply's stats typed from the engine to the store and back, a chat's one mapping to sampling
parameters, a model choice's one mapping to load options (the window's and the CLI's)."""

from __future__ import annotations

import argparse
import math

from app.cli.options import add_model_options, load_options_from
from engine.domain.chat import ChatMessage, ChatSettings, OutputKind, OverflowPolicy, format_stats
from engine.domain.model_choice import ModelChoice
from engine.domain.reply_stats import KEPT, ReplyStats
from engine.load.load_options import LoadOptions
from engine.types import FinishReason, RequestStats


def request_stats() -> RequestStats:
    return RequestStats(
        prompt_tokens=12, cached_prompt_tokens=8, output_tokens=5, ttft_s=0.25, decode_tokens_per_s=40.0, e2e_s=0.4,
        queue_s=0.01, preemptions=0, finish_reason=FinishReason.STOP, inter_token_s=[0.02] * 4,
    )  # fmt: skip


def test_a_reply_keeps_its_stats_typed_from_the_engine_to_the_store_and_back() -> None:
    stats = ReplyStats.of(request_stats())
    assert stats.output_tokens == 5 and stats.ttft_s == 0.25 and stats.tokens_used == 17 and not stats.context_full
    stored = ChatMessage("assistant", "hi", stats, FinishReason.STOP).to_dict()
    assert set(stored["stats"]) == set(KEPT)  # no latencies, no context_full while it is not so
    again = ChatMessage.from_dict(stored)
    assert again.stats == stats and isinstance(again.stats, ReplyStats)
    full = ReplyStats.from_dict({**stats.to_dict(), "context_full": True})
    assert full is not None and full.context_full
    assert format_stats(ChatMessage("assistant", "x", full, FinishReason.LENGTH)).endswith("end of the context")


def test_hand_edited_stats_read_as_unknown_not_as_strings() -> None:
    odd = ReplyStats.from_dict({"output_tokens": "many", "ttft_s": math.nan, "prompt_tokens": True, "e2e_s": 1.5})
    assert odd == ReplyStats(e2e_s=1.5)
    assert ReplyStats.from_dict(["not", "an", "object"]) is None


def test_chat_settings_read_unknown_policies_and_kinds_as_the_defaults() -> None:
    settings = ChatSettings.from_dict({"overflow": "newer_policy", "output": ["json"]})
    assert settings.overflow is OverflowPolicy.STOP and settings.output is OutputKind.TEXT
    assert ChatSettings.from_dict({"overflow": "rolling_window"}).overflow is OverflowPolicy.ROLLING
    params = ChatSettings(temperature=0.0, max_tokens=9, output=OutputKind.JSON, show_tokens=True).to_params()
    assert params.max_tokens == 9 and params.temperature == 0.0 and params.structured.kind == "json_object"
    assert params.logprobs


def test_the_window_and_the_cli_map_a_model_choice_to_the_same_load_options() -> None:
    parser = argparse.ArgumentParser()
    add_model_options(parser)
    args = parser.parse_args(["--model", "m.gguf", "--dtype", "float32", "--quant", "int4", "--device", "cpu"])
    options = load_options_from(args)
    assert options == LoadOptions("float32", "int4", "cpu")
    choice = ModelChoice.of(args.model, options, kv_memory_mib=256)
    assert choice.load_options == options and choice.spec == "m.gguf" and choice.kv_memory_bytes == 256 * 1024**2
    assert ModelChoice.from_dict(choice.to_dict()) == choice
