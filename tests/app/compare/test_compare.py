"""The compare view: targets on offer, one prompt on two local variants one after another (by token), a local and
a remote one at once (by word), and what a column says when its target cannot run."""

from __future__ import annotations

import pytest

from app.compare.diff import BY_TOKEN, BY_WORD, compare_replies
from app.compare.targets import LOADED, compare_targets
from engine.domain.model_choice import ModelChoice
from engine.load.loader import ModelInfo
from widgets.tokens.data import TokenEntry, TokenKind

PROMPT = "Tell me about the sea."


def info(**changes) -> ModelInfo:
    base = dict(name="Tiny", spec="x", source_kind="folder", folder="x", architecture="llama", device="cpu",
                dtype="float32", quantization="none", parameters=1, weight_bytes=1, kv_bytes_per_token=1,
                context_length=2048, load_seconds=0.1)  # fmt: skip
    return ModelInfo(**{**base, **changes})


def test_targets_are_the_loaded_model_its_variants_recent_models_and_remotes() -> None:
    recent = [ModelChoice(spec="/models/qwen", quantization="int8"), ModelChoice(spec="x", dtype="bfloat16")]
    targets = compare_targets(info(), ModelChoice(spec="x"), recent, [("remote:x", "m @ gpu")], ["bfloat16"])
    keys = [t.key for t in targets]
    assert keys[0] == LOADED and targets[0].label == "Tiny, as loaded (float32, layers bfloat16)"
    assert "variant:float32:none" in keys and "variant:bfloat16:none" in keys  # auto: an explicit float32 differs
    assert any(k.startswith("model:") and "qwen" in k for k in keys) and sum("model:" in k for k in keys) == 1
    assert targets[-1].key == "remote:remote:x" and targets[-1].backend_id == "remote:x"
    assert targets[-1].label == "m @ gpu (remote)"
    explicit = compare_targets(info(), ModelChoice(spec="x", dtype="float32"), [], [])
    assert "variant:float32:none" not in [t.key for t in explicit]
    assert compare_targets(None, None, [], [("remote:x", "m")])[0].backend_id == "remote:x"  # no model loaded


def test_a_gguf_model_is_offered_the_variants_its_file_can_load() -> None:
    """bitsandbytes' nf4 applies to safetensors models: a GGUF file's variants are float32, bfloat16, int8."""
    gguf = compare_targets(info(source_kind="gguf-file", quantization="int4+int8"), ModelChoice(spec="x"), [], [])
    keys = [t.key for t in gguf]
    assert "variant:auto:nf4" not in keys and "variant:auto:int8" in keys and "variant:float32:none" in keys
    assert "variant:auto:nf4" in [t.key for t in compare_targets(info(), ModelChoice(spec="x"), [], [])]


def test_replies_compare_by_token_with_one_tokenizer_and_by_word_otherwise() -> None:
    a = [TokenEntry("The", token_ids=(1,)), TokenEntry(" sea", token_ids=(2,)), TokenEntry(" is", token_ids=(3,))]
    b = [TokenEntry("The", token_ids=(1,)), TokenEntry(" ocean", token_ids=(9,)), TokenEntry(" is", token_ids=(3,))]
    same = compare_replies([a, b], ["k", "k"])
    assert same.mode == BY_TOKEN and same.marked == [[False, True, False], [False, True, False]]
    assert same.summaries[1] == "1 of 3 tokens differ from the first column"
    assert same.summaries[0].endswith("compared by token")
    other = compare_replies([a, b], ["k", "j"])
    assert other.mode == BY_WORD and "the tokenizers differ" in other.summaries[0]
    chunks = [TokenEntry("The sea", kind=TokenKind.CHUNK), TokenEntry(" is", kind=TokenKind.CHUNK)]
    remote = compare_replies([a, chunks], ["k", None])
    assert remote.mode == BY_WORD and remote.identical and "a remote sends text" in remote.summaries[0]


def run_and_wait(qtbot, window, keys: list[str], max_tokens: int = 12):
    controller = window.compare
    controller.open()
    with qtbot.waitSignal(controller.run_finished, timeout=120_000) as finished:
        assert controller.run(PROMPT, keys, max_tokens)
    return controller, finished.args[0]


def test_two_local_variants_run_one_after_another_and_compare_by_token(qtbot, make_window) -> None:
    window = make_window()
    controller = window.compare
    controller.refresh_targets()
    controller, comparison = run_and_wait(qtbot, window, [LOADED, "variant:bfloat16:none"])
    assert comparison.mode == BY_TOKEN
    for column, final in zip(controller.view.columns, controller.finals, strict=True):
        assert final is not None and final.error is None and final.stats.output_tokens >= 1
        assert column.status.text().startswith("TTFT ") and "tok/s" in column.status.text()
        assert column.tokens.toPlainText() and column.diff.text()
    assert [p.currentData() for p in controller.view.pickers] == [LOADED, "variant:bfloat16:none"]
    assert not controller.view.stop_button.isEnabled() and controller.view.run_button.isEnabled()


def test_a_local_and_a_remote_target_compare_by_word(qtbot, make_window, tiny_server, server_api_key) -> None:
    window = make_window()
    assert window.remote.add_endpoint("studio", tiny_server.url, server_api_key, ["tiny"])
    controller = window.compare
    controller.refresh_targets()
    remote_key = next(k for k in controller.targets if k.startswith("remote:"))
    controller, comparison = run_and_wait(qtbot, window, [LOADED, remote_key])
    assert comparison.mode == BY_WORD
    remote_final = controller.finals[1]
    assert remote_final is not None and remote_final.error is None and remote_final.stats.output_tokens >= 1
    assert all(e.kind == "word" for e in controller.view.columns[1].tokens.entries)


def test_without_a_loaded_model_a_local_column_says_why(qtbot, make_window) -> None:
    window = make_window(load=False)
    controller = window.compare
    from app.compare.targets import CompareTarget
    from engine.experiments.compare import LocalTarget

    controller.targets = {
        "a": CompareTarget("a", "A", LocalTarget("A")),
        "b": CompareTarget("b", "B", LocalTarget("B")),
    }
    with qtbot.waitSignal(controller.run_finished, timeout=10_000):
        assert controller.run(PROMPT, ["a", "b"], 8)
    assert all("no model is loaded" in c.status.text() for c in controller.view.columns)


@pytest.mark.parametrize("count", [2, 4])
def test_two_to_four_targets_can_be_picked(qtbot, count) -> None:
    from widgets.compare.compare_view import MAX_TARGETS, CompareView

    view = CompareView()
    qtbot.addWidget(view)
    view.set_choices([(f"k{i}", f"target {i}") for i in range(5)])
    while len(view.pickers) < count:
        view.add_picker()
    assert view.target_keys() == [f"k{i}" for i in range(count)]
    assert view.add_picker() is None if count == MAX_TARGETS else view.add_button.isEnabled()
    view.prompt.setPlainText(PROMPT)
    with qtbot.waitSignal(view.run_requested) as asked:
        view.run_button.click()
    assert asked.args == [PROMPT, [f"k{i}" for i in range(count)], 64]


def test_stop_ends_every_column(qtbot, make_window) -> None:
    window = make_window()
    controller = window.compare
    controller.open()
    controller.refresh_targets()
    with qtbot.waitSignal(controller.run_finished, timeout=120_000):
        assert controller.run(PROMPT, [LOADED, "variant:bfloat16:none"], 2000)
        qtbot.waitUntil(lambda: bool(controller.replies[0]), timeout=60_000)
        controller.view.stop_button.click()
    assert [f.finish_reason for f in controller.finals] == ["abort", "abort"]
    assert controller.view.run_button.isEnabled()


def test_targets_are_named_by_what_differs_and_pickers_show_it(qtbot) -> None:
    """Defect 5 of the window issue: with three targets every picker read "SmolLM2-135M-Instruct," and nothing else."""
    from widgets.compare.compare_view import CompareView

    name = "SmolLM2-135M-Instruct"
    targets = compare_targets(info(name=name), ModelChoice(spec="x"), [], [("remote:x", "m @ gpu")], ["bfloat16"])
    names = [t.name for t in targets]
    assert len(set(names)) == len(names) and not any(n.startswith(name) for n in names)
    assert names[0] == "as loaded (float32, layers bfloat16)" and "int8 load" in names
    view = CompareView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.set_choices([(t.key, t.label, t.name) for t in targets])
    view.add_picker("variant:auto:int8")
    shown = [p.currentText() for p in view.pickers]
    assert len(set(shown)) == len(shown) == 3 and shown[2] == "int8 load"
    assert view.pickers[2].toolTip() == f"{name}, int8"  # the whole name on hover
    columns = view.begin([t.name for t in targets[:2]], [t.label for t in targets[:2]])
    assert columns[1].title.toolTip() == targets[1].label


def test_the_diff_counts_tokens_that_came_in_one_step_as_tokens() -> None:
    """The header said 64 tokens where the diff said "of 63": two accepted draft tokens arrive as one entry."""
    a = [TokenEntry("The", token_ids=(1,)), TokenEntry(" sea is", token_ids=(2, 3)), TokenEntry(".", token_ids=(4,))]
    b = [TokenEntry("The", token_ids=(1,)), TokenEntry(" sea is", token_ids=(2, 3)), TokenEntry("!", token_ids=(5,))]
    result = compare_replies([a, b], ["k", "k"])
    assert result.summaries[1] == "1 of 4 tokens differ from the first column"
    assert result.summaries[0].startswith("reference: 1 of 4 tokens")
