"""StudioStatusBar: the loaded model, its device and precision, KV pages in use, requests running and waiting
(long texts elide rather than widen the window)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QProgressBar, QStatusBar, QWidget

from widgets.elided_label import ElidedLabel
from widgets.steady_label import SteadyLabel
from widgets.steady_progress_bar import SteadyProgressBar

# "3 of 8", "3/8" or "40 %" in a stage's text: how far it is, for a bar that fills instead of one that only moves
_OF = re.compile(r"\b(\d+)\s*(?:of|/)\s*(\d+)\b")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")
TICK_MS = 1000  # the running stage's seconds count up while it runs


def stage_fraction(text: str) -> float | None:
    """How far a stage is, where its text says so; None where it does not."""
    match = _OF.search(text)
    if match and int(match.group(2)) > 0:
        return min(1.0, int(match.group(1)) / int(match.group(2)))
    match = _PERCENT.search(text)
    return min(1.0, float(match.group(1)) / 100) if match else None


class StudioStatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("studioStatus")
        self.loading = QProgressBar()
        self.loading.setRange(0, 0)  # busy, unless a stage's text says how far it is
        self.loading.setMaximumWidth(120)
        self.loading.setMaximumHeight(14)
        self.loading.setTextVisible(False)
        self.loading.setVisible(False)
        # a long model name, path or loading step shortens itself; it must never widen the window
        self.model = ElidedLabel("no model")
        # the counts change a few times a second while replies stream: labels that repaint alone (SteadyLabel)
        self.device = SteadyLabel()
        self.precision = SteadyLabel()
        self.pages = SteadyProgressBar()
        self.pages.setFixedWidth(90)
        self.pages.setMaximumHeight(12)
        self.pages.setTextVisible(False)
        self.pages.setRange(0, 1)
        self.pages.setValue(0)
        self.pages_label = SteadyLabel()
        for widget in (self.pages, self.pages_label):
            widget.setToolTip("KV-cache pages in use / pages in the pool")
        self.requests = SteadyLabel("running 0 · waiting 0")
        self.requests.setToolTip("requests decoding in the engine / queued for pages or a batch slot")
        self.clock: Callable[[], float] = time.monotonic
        self._stage: str | None = None
        self._stage_started = 0.0
        self._stages: list[tuple[str, float]] = []  # (stage, seconds) of this load, for the tooltip
        self._tick = QTimer(self, interval=TICK_MS)
        self._tick.timeout.connect(self._show_stage)
        self.addWidget(self.loading)
        self.addWidget(self.model, 1)
        for widget in (self.device, self.precision, self.pages, self.pages_label, self.requests):
            self.addPermanentWidget(widget)
        self.set_engine_state(0, 0, 0, 0)

    def set_loading(self, text: str | None) -> None:
        """Show the stage the loader is in (any text it reports), how long it has run and, where its text says, how
        far it is; None when loading is done."""
        now = self.clock()
        if self._stage is not None and (text or "").rstrip(".… ") != self._stage:
            self._stages.append((self._stage, now - self._stage_started))
        self.loading.setVisible(text is not None)
        if text is None:
            if self._stages:  # what took the time stays readable: a first start converts and compiles
                total = sum(seconds for _stage, seconds in self._stages)
                done = "; ".join(f"{stage} {seconds:.0f} s" for stage, seconds in self._stages)
                self.model.setToolTip(f"Loaded in {total:.0f} s ({done})")
            self._stage = None
            self._stages.clear()
            self._tick.stop()
            return
        text = text.rstrip(".… ")
        if text != self._stage:
            self._stage, self._stage_started = text, now
        fraction = stage_fraction(text)
        if fraction is None:
            self.loading.setRange(0, 0)
        else:
            self.loading.setRange(0, 1000)
            self.loading.setValue(round(fraction * 1000))
        self._show_stage()
        self._tick.start()

    def _show_stage(self) -> None:
        if self._stage is None:
            return
        seconds = int(self.clock() - self._stage_started)
        self.model.setText(f"{self._stage}… {seconds} s" if seconds >= 1 else f"{self._stage}…")
        done = [f"{stage}: {secs:.0f} s" for stage, secs in self._stages]
        self.model.setToolTip("\n".join(["Loading the model", *done, f"{self._stage}: running"]))

    def set_model(self, name: str, device: str, dtype: str, quantization: str) -> None:
        self.set_loading(None)
        self.model.setText(name)
        self.device.setText(device)
        self.precision.setText(dtype if quantization in ("", "none") else f"{dtype} · {quantization}")

    def set_runtime(self, summary: str, details: str) -> None:
        """What the engine computes in (e.g. 'float32 · layers bfloat16'), with the whole record as the tooltip."""
        self.precision.setText(summary)
        self.precision.setToolTip(details)
        self.model.setToolTip(f"{self.model.toolTip()}\n{details}".strip())

    def set_engine_state(
        self, pages_used: int, pages_total: int, running: int, waiting: int, held_by: str | None = None
    ) -> None:
        """held_by: what has the engine to itself now (an experiment), said beside the counts."""
        self.pages.setRange(0, max(1, pages_total))
        self.pages.setValue(min(pages_used, max(1, pages_total)))
        self.pages.setVisible(pages_total > 0)
        self.pages_label.setText(f"KV {pages_used} / {pages_total} pages" if pages_total else "")
        held = f" for {held_by}" if held_by else ""
        self.requests.setText(f"running {running} · waiting {waiting}{held}")
