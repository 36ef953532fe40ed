"""Memory pressure tells honestly what preemption did to the replies; Capacity finds where preemption starts."""

from __future__ import annotations

import dataclasses

import pytest

from engine.core.config import EngineConfig
from engine.experiments.capacity import capacity_row
from engine.experiments.catalog import experiment
from engine.experiments.plumbing import ExperimentContext, ExperimentSizes
from engine.experiments.pressure import compute_precision, first_divergence, replies_note


def fresh_embedded(monkeypatch, claimed: str):
    """The embedded model loaded anew in float32 (the session's may have its forward built already) with the claimed
    dot products forced on or off."""
    from engine.load.loader import load_model
    from engine.load.options import LoadOptions
    from engine.model import dense_rows

    monkeypatch.setenv(dense_rows.ENV, claimed)
    return load_model(None, LoadOptions(dtype="float32"))


def test_memory_pressure_on_float32_weights_keeps_the_replies_identical(monkeypatch) -> None:
    """The embedded model loaded with an explicit float32 computes exactly, whatever the batch shape: with one float
    product for every step size (a machine that measured the claimed dot products faster for a few rows runs them
    there, and its experiment says so: test_claimed_products_are_not_called_batch_invariant)."""
    ctx = ExperimentContext(fresh_embedded(monkeypatch, "never"), EngineConfig(), ExperimentSizes.small())
    result = experiment("memory_pressure").run(ctx)
    ample, tight = result.figures
    assert ample["preemptions"] == 0 and tight["preemptions"] > 0
    assert tight["identical_outputs"] and tight["first_divergence"] is None
    assert tight["compute_precision"] == "float32"
    assert "identical, token for token" in result.notes[-1] and "only time" in result.notes[-1]
    assert not any("DIFFERENT" in note for note in result.notes)


def test_claimed_products_are_not_called_batch_invariant(monkeypatch) -> None:
    from engine.core.engine import Engine
    from engine.model import dense_rows

    engine = Engine(fresh_embedded(monkeypatch, "always"))
    if not engine.runtime_record()["claimed_rows"]:
        pytest.skip("no compiled step here (no compiler): no claimed products")
    precision, exact = compute_precision(engine)
    assert not exact and precision.startswith("float32 (claimed dot products at 1-")
    note = replies_note((0, 3), precision, exact)
    assert "bug" not in note and "batch shape" in note and f"{dense_rows.ENV}=never" in note
    plain = Engine(fresh_embedded(monkeypatch, "never"))
    assert plain.runtime_record()["claimed_rows"] == 0 and compute_precision(plain) == ("float32", True)


def test_where_replies_part_the_note_says_from_which_token_and_why() -> None:
    assert first_divergence([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) is None
    assert first_divergence([[1, 2, 3, 4], [4, 5, 6, 7]], [[1, 2, 9, 9], [4, 8, 6, 7]]) == (1, 1)
    assert first_divergence([[1, 2]], [[1, 2, 3]]) == (0, 2)
    note = replies_note((1, 1), "bfloat16", exact=False)
    assert note.startswith("The replies match the run with ample memory up to token 2 of chat #2, then part.")
    assert "bfloat16" in note and "batch shape" in note and "float32" in note
    assert "only time is lost" not in note and "identical to" not in note.split("float32")[0]
    quantized = replies_note((0, 5), "int8 weights (float32 arithmetic)", exact=False)
    assert "int8 weights" in quantized and "token 6 of chat #1" in quantized
    assert "bug" in replies_note((0, 5), "float32", exact=True)


def test_capacity_finds_where_preemption_starts_as_chats_grow_longer(tiny_loaded) -> None:
    ctx = ExperimentContext(tiny_loaded, EngineConfig(), ExperimentSizes.small())
    result = experiment("capacity").run(ctx)
    short, long = result.figures
    assert (short["length"], long["length"]) == (64, 96)
    assert short["pages_per_chat"] == 16 and long["pages_per_chat"] == 24  # 4-token pages
    assert short["fit"] == 40 // 16 and long["fit"] == 40 // 24
    for figures in result.figures:
        assert figures["ran_at_once"] == figures["fit"]  # all of them side by side
        assert figures["preemptions_at_fit"] == 0  # the budget holds exactly that many
        assert figures["preemptions_one_more"] > 0  # one more, and pages run out
    assert [row[:3] for row in result.rows] == [["64 tokens", "16", "2"], ["96 tokens", "24", "1"]]
    assert result.rows[0][3] == "2 need 32 of 40 pages: no preemption"
    assert result.rows[0][4].startswith("3 need 48 of 40 pages: ") and result.rows[0][4].endswith("preemptions")
    assert "preempted" in result.notes[0]


def test_capacity_grows_its_chats_side_by_side_without_drafts(tiny_loaded, monkeypatch) -> None:
    """Drafts let a chat whose drafts hit finish early and free its pages: on the real model, 4 chats of 256 tokens
    in 48 pages (64 needed) then ran without a preemption, against the experiment's own arithmetic."""
    engines = []
    original = ExperimentContext.engine
    monkeypatch.setattr(
        ExperimentContext, "engine", lambda self, *a, **kw: engines.append(original(self, *a, **kw)) or engines[-1]
    )
    sizes = dataclasses.replace(ExperimentSizes.small(), capacity_lengths=(64,))  # one length shows it
    ctx = ExperimentContext(tiny_loaded, EngineConfig(speculative=True), sizes)
    experiment("capacity").run(ctx)
    assert len(engines) == 2 and not any(engine.config.speculative for engine in engines)


def test_a_capacity_row_says_what_the_pages_need_and_what_the_run_did() -> None:
    figures = {"length": 256, "pages_per_chat": 16, "fit": 3, "ran_at_once": 3, "preemptions_at_fit": 0}
    row = capacity_row({**figures, "preemptions_one_more": 51}, 48)
    assert row == [
        "256 tokens",
        "16",
        "3",
        "3 need 48 of 48 pages: no preemption",
        "4 need 64 of 48 pages: 51 preemptions",
    ]
    assert capacity_row({**figures, "preemptions_one_more": 1}, 48)[4] == "4 need 64 of 48 pages: 1 preemption"
    # over the budget without a preemption (the drafts' case): the row never reads as if the arithmetic held
    assert capacity_row({**figures, "preemptions_one_more": 0}, 48)[4] == "4 need 64 of 48 pages: yet no preemption"
