"""The status bar names the loading stage that runs, how long it has run and, where its text says, how far it is
(defect 4 of the window issue: "Allocating the KV cache" for 90 s with a bar that only moved)."""

from __future__ import annotations

from widgets.status_bar import StudioStatusBar, stage_fraction


def test_stage_fraction_reads_counts_and_percentages() -> None:
    assert stage_fraction("measuring weight formats (3 of 8)") == 3 / 8
    assert stage_fraction("converting model.gguf 12/48 tensors") == 0.25
    assert stage_fraction("compiling the decode step, 40 %") == 0.4
    assert stage_fraction("allocating the KV cache") is None


def test_each_stage_shows_its_name_its_seconds_and_its_progress(qtbot) -> None:
    bar = StudioStatusBar()
    qtbot.addWidget(bar)
    now = [100.0]
    bar.clock = lambda: now[0]
    bar.set_loading("Loading SmolLM2…")
    assert bar.loading.isVisibleTo(bar) and bar.loading.maximum() == 0  # no count: a busy bar
    assert bar.model.text() == "Loading SmolLM2…"
    bar.set_loading("Compiling the decode step for this CPU (first start only)")
    now[0] += 7.4
    bar._show_stage()  # the one-second tick
    assert bar.model.text() == "Compiling the decode step for this CPU (first start only)… 7 s"
    bar.set_loading("Measuring weight formats (3 of 8)")
    assert bar.loading.maximum() == 1000 and bar.loading.value() == 375  # a bar that fills
    assert bar.model.text() == "Measuring weight formats (3 of 8)…"
    assert "Compiling the decode step for this CPU (first start only): 7 s" in bar.model.toolTip()
    now[0] += 2
    bar.set_model("SmolLM2", "cpu", "float32", "none")
    assert not bar.loading.isVisibleTo(bar) and bar.model.text() == "SmolLM2"
    assert bar.model.toolTip().startswith("Loaded in 9 s")
