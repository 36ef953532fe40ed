"""EstimateBox: the loader's memory estimate for a model choice, and whether it fits in free memory."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QGroupBox, QLabel, QPushButton, QWidget

from engine.load.estimate import MemoryEstimate, format_bytes

ROWS = (
    ("weights", "Weights"),
    ("kv_token", "KV cache per token"),
    ("context", "Tokens that fit in the KV cache"),
    ("memory", "Memory"),
    ("speed", "Decode speed"),
)


class EstimateBox(QGroupBox):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Estimate", parent)
        self.setObjectName("estimateBox")
        grid = QGridLayout(self)
        self.labels: dict[str, QLabel] = {}
        for row, (key, text) in enumerate(ROWS):
            grid.addWidget(QLabel(text), row, 0)
            value = QLabel("–")
            value.setProperty("role", "value")
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.labels[key] = value
            grid.addWidget(value, row, 1)
        self.fits = QLabel()
        self.fits.setWordWrap(True)
        grid.addWidget(self.fits, len(ROWS), 0, 1, 2)
        self.button = QPushButton("Estimate")
        self.button.setToolTip("Hub repositories are fetched to read their size, so they are estimated on request")
        grid.addWidget(self.button, len(ROWS) + 1, 1, Qt.AlignmentFlag.AlignRight)
        grid.setColumnStretch(1, 1)

    def show_pending(self) -> None:
        self.clear()
        self.labels["weights"].setText("estimating…")

    def clear(self, error: str | None = None) -> None:
        for label in self.labels.values():
            label.setText("–")
        self._set_fits(error or "", warning=bool(error))

    def show_estimate(
        self, estimate: MemoryEstimate, kv_bytes: int, free_bytes: int, free_what: str, auto_kv: bool = False
    ) -> bool:
        """Fill in the figures; True when weights, the KV budget and the runtime fit in the free memory. auto_kv:
        kv_bytes is the automatic budget (said so)."""
        tokens = estimate.kv_tokens_for(kv_bytes)
        context = estimate.shape.context_length
        total = estimate.total_bytes(kv_bytes)
        quant = "" if estimate.quantization == "none" else f", {estimate.quantization}"
        weights = f"{format_bytes(estimate.weight_bytes)} ({estimate.dtype}{quant})"
        if estimate.engine_copy_bytes:
            weights += f" + about {format_bytes(estimate.engine_copy_bytes)} of faster copies the engine makes"
        self.labels["weights"].setText(weights)
        self.labels["weights"].setToolTip(estimate.weight_formats)
        self.labels["kv_token"].setText(f"{format_bytes(estimate.kv_bytes_per_token)} ({estimate.kv_dtype})")
        budget = f"auto: {format_bytes(kv_bytes)}, " if auto_kv else ""
        self.labels["context"].setText(f"{budget}{tokens:,} tokens, shared by all chats (model context {context:,})")
        self.labels["memory"].setText(
            f"{format_bytes(total)} needed (with {format_bytes(estimate.runtime_bytes)} of runtime), "
            f"{format_bytes(free_bytes)} {free_what}"
        )
        self.labels["speed"].setText(estimate.decode_note[:1].upper() + estimate.decode_note[1:] or "–")
        fits = total <= free_bytes
        if fits:
            self._set_fits("Fits in memory.", warning=False)
        else:
            self._set_fits(
                "Does not fit in free memory: loading may fail or swap heavily. Lower the KV cache, pick a "
                "smaller data type or quantization, or load anyway.",
                warning=True,
            )
        return fits

    def _set_fits(self, text: str, warning: bool) -> None:
        self.fits.setText(text)
        self.fits.setObjectName("fitsWarning" if warning else "fitsOk")
        self.fits.style().unpolish(self.fits)  # the colour comes from the style sheet, by object name
        self.fits.style().polish(self.fits)
