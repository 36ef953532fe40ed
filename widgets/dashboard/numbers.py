"""Panel: the headline numbers of the window (latencies, speeds, prefix hits, KV waste, preemptions, memory)."""

from __future__ import annotations

from PySide6.QtWidgets import QGridLayout, QLabel, QSizePolicy, QWidget

from widgets.dashboard.data.series import MemoryInfo, WindowView
from widgets.dashboard.data.stats import Summary, summarize
from widgets.dashboard.panel import Panel

# key, caption, tooltip
TILES = (
    ("ttft_p50", "TTFT p50", "time to first token, median: queueing + prefill"),
    ("ttft_p99", "TTFT p99", "time to first token, 99th percentile"),
    ("itl_p50", "inter-token p50", "time between two tokens of one reply, median"),
    ("itl_p99", "inter-token p99", "time between two tokens of one reply, 99th percentile"),
    ("engine_rate", "output tok/s", "tokens produced per second by the whole engine while it was busy"),
    ("stream_rate", "per-stream tok/s", "decode speed of one reply: 1 / median inter-token latency"),
    ("prefix_hits", "prefix cache hits", "share of prompt tokens found in cached prefix pages (not prefilled again)"),
    (
        "kv_waste",
        "KV waste",
        "share (and number) of token slots handed out but not filled: the unused tails of each request's last page",
    ),
    ("preemptions", "preemptions", "requests evicted from the KV cache for lack of pages, to be recomputed"),
    (
        "prefill_stall",
        "prefill stall",
        "how much longer the chats already streaming waited for their next token because a new prompt was "
        "prefilled in the same step: the longest such pause in the window · all of them together",
    ),
    ("kv_pages", "KV pages used", "pages held by requests now / pages in the pool"),
    ("weights", "weights memory", "memory the loaded model's weights take"),
    ("kv_memory", "KV memory", "KV cache in use now / the whole page pool"),
)
MAX_COLUMNS = 3
TILE_WIDTH = 140  # a value like "85 ms · 0.42 s" at the panel's font; narrower panels get fewer columns


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.1f} ms"


def _mib(value: int) -> str:
    return "–" if not value else f"{value / 1024**2:,.0f} MiB" if value >= 1024**2 else f"{value / 1024:.0f} KiB"


def format_summary(s: Summary) -> dict[str, str]:
    waste = s.kv_waste_fraction
    return {
        "ttft_p50": _ms(s.ttft_p50_s),
        "ttft_p99": _ms(s.ttft_p99_s),
        "itl_p50": _ms(s.itl_p50_s),
        "itl_p99": _ms(s.itl_p99_s),
        "engine_rate": "–" if s.output_tokens_per_s is None else f"{s.output_tokens_per_s:.1f}",
        "stream_rate": "–" if s.stream_tokens_per_s is None else f"{s.stream_tokens_per_s:.1f}",
        "prefix_hits": "–" if s.prefix_hit_rate is None else f"{s.prefix_hit_rate:.0%}",
        "kv_waste": "–" if waste is None else f"{waste:.0%} · {s.kv_waste_slots}",
        "preemptions": str(s.preemptions),
        "prefill_stall": "–"
        if s.prefill_stall_max_s is None
        else f"{_ms(s.prefill_stall_max_s)} · {s.prefill_stall_total_s:.2f} s",
        "kv_pages": f"{s.pages_used} / {s.pages_total}" if s.pages_total else "–",
        "weights": _mib(s.weight_bytes),
        "kv_memory": f"{s.kv_used_bytes / 1024**2:,.0f}/{_mib(s.kv_pool_bytes)}" if s.kv_pool_bytes else "–",
    }


class NumbersPanel(Panel):
    key = "numbers"
    title = "Numbers"
    explanation = "Figures over the selected time window; KV figures are the pool as it is now."

    def build(self) -> None:
        grid_host = QWidget()
        self.grid = QGridLayout(grid_host)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setHorizontalSpacing(14)
        self.grid.setVerticalSpacing(4)
        self.values: dict[str, QLabel] = {}
        self.captions: list[QLabel] = []
        for key, caption, tip in TILES:
            label = QLabel(caption)
            value = QLabel("–")
            value.setObjectName(f"number-{key}")
            # no re-layout per update, and no minimum: a narrow dock gets fewer columns instead of a clipped one
            value.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            for widget in (label, value):
                widget.setToolTip(tip)
            self.values[key] = value
            self.captions.append(label)
        self.columns = 0
        self._arrange(MAX_COLUMNS)
        self.body.addWidget(grid_host)
        self.body.addStretch(1)
        self.memory = MemoryInfo()
        self.summary: Summary | None = None

    def _arrange(self, columns: int) -> None:
        """Tiles row by row in `columns` columns (three in a wide panel, fewer as the dock narrows)."""
        if columns == self.columns:
            return
        self.columns = columns
        pairs = list(zip(self.captions, self.values.values(), strict=True))
        for label, value in pairs:
            self.grid.removeWidget(label)
            self.grid.removeWidget(value)
        for i, (label, value) in enumerate(pairs):
            row, col = divmod(i, columns)
            self.grid.addWidget(label, row * 2, col)
            self.grid.addWidget(value, row * 2 + 1, col)
        for col in range(MAX_COLUMNS):
            self.grid.setColumnStretch(col, 1 if col < columns else 0)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._arrange(max(1, min(MAX_COLUMNS, event.size().width() // TILE_WIDTH)))

    def restyle(self) -> None:
        for label in self.captions:
            label.setStyleSheet(f"color: {self.theme.muted}; font-size: 9pt;")
        for value in self.values.values():
            value.setStyleSheet(f"color: {self.theme.foreground}; font-size: 13pt; font-weight: 600;")

    def set_memory(self, memory: MemoryInfo) -> None:
        self.memory = memory

    def text(self, key: str) -> str:
        return self.values[key].text()

    def refresh(self, view: WindowView) -> None:
        self.summary = summarize(view, self.memory)
        for key, text in format_summary(self.summary).items():
            self.values[key].setText(text)
