"""StudioStatusBar: the loaded model, its device and precision, KV pages in use, requests running and waiting
(long texts elide rather than widen the window)."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from widgets.elided_label import ElidedLabel


class StudioStatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("studioStatus")
        self.loading = QProgressBar()
        self.loading.setRange(0, 0)  # busy: the loader reports steps, not fractions
        self.loading.setMaximumWidth(120)
        self.loading.setMaximumHeight(14)
        self.loading.setTextVisible(False)
        self.loading.setVisible(False)
        # a long model name, path or loading step shortens itself; it must never widen the window
        self.model = ElidedLabel("no model")
        self.device = QLabel()
        self.precision = QLabel()
        self.pages = QProgressBar()
        self.pages.setFixedWidth(90)
        self.pages.setMaximumHeight(12)
        self.pages.setTextVisible(False)
        self.pages.setRange(0, 1)
        self.pages.setValue(0)
        self.pages_label = QLabel()
        for widget in (self.pages, self.pages_label):
            widget.setToolTip("KV-cache pages in use / pages in the pool")
        self.requests = QLabel("running 0 · waiting 0")
        self.requests.setToolTip("requests decoding in the engine / queued for pages or a batch slot")
        self.addWidget(self.loading)
        self.addWidget(self.model, 1)
        for widget in (self.device, self.precision, self.pages, self.pages_label, self.requests):
            self.addPermanentWidget(widget)
        self.set_engine_state(0, 0, 0, 0)

    def set_loading(self, text: str | None) -> None:
        """Show what the loader is doing, or None when it is done."""
        self.loading.setVisible(text is not None)
        if text is not None:
            self.model.setText(text)

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

    def set_engine_state(self, pages_used: int, pages_total: int, running: int, waiting: int) -> None:
        self.pages.setRange(0, max(1, pages_total))
        self.pages.setValue(min(pages_used, max(1, pages_total)))
        self.pages.setVisible(pages_total > 0)
        self.pages_label.setText(f"KV {pages_used} / {pages_total} pages" if pages_total else "")
        self.requests.setText(f"running {running} · waiting {waiting}")
