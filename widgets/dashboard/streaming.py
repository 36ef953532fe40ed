"""Panel: inter-token latency of every streamed token per chat, each request's TTFT marked, and an ITL histogram."""

from __future__ import annotations

import math
from html import escape

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QApplication, QComboBox, QHBoxLayout, QLabel

from widgets.dashboard.data.series import WindowView
from widgets.dashboard.data.stats import chat_latencies, itl_histogram
from widgets.dashboard.data.theme import chat_colour
from widgets.dashboard.panel import TIME_LABEL, Panel, add_plot, legend_html, legend_label, set_window, style_plot

ALL_CHATS = "All chats"


def nice_step(raw: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is at least `raw`."""
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


class StreamingPanel(Panel):
    key = "streaming"
    title = "Per-token streaming"
    explanation = (
        "Every token as it arrives: the time since the previous token of the same reply (inter-token latency), "
        "one colour per chat; a star marks each reply's first token at its time-to-first-token "
        "(queueing + prefill); a diamond marks a token that came as an accepted speculative draft (it arrived in "
        "the same step as the token before it, so its latency is near zero). Right: how inter-token latencies "
        "are distributed."
    )

    def build(self) -> None:
        row = QHBoxLayout()
        row.addWidget(QLabel("Chat:"))
        self.chat_box = QComboBox()
        self.chat_box.addItem(ALL_CHATS)
        self.chat_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        row.addWidget(self.chat_box)
        self.legend = legend_label()
        row.addWidget(self.legend, 1)
        self.body.addLayout(row)
        self.graphics = self.new_graphics()
        self.body.addWidget(self.graphics)
        self.latency_plot = add_plot(self.graphics, 0, "ms", TIME_LABEL)
        self.histogram_plot = self.graphics.addPlot(row=0, col=1)
        self.histogram_plot.setMouseEnabled(x=False, y=False)
        self.histogram_plot.setMenuEnabled(False)
        self.histogram_plot.hideButtons()
        self.histogram_plot.setLabel("bottom", "inter-token ms")
        self.histogram_plot.getViewBox().setLimits(yMin=0)
        self.histogram_plot.getAxis("bottom").setStyle(maxTickLevel=0)  # a narrow chart: major ticks only
        self.graphics.ci.layout.setColumnStretchFactor(0, 3)
        self.graphics.ci.layout.setColumnStretchFactor(1, 1)
        self.itl_curves: dict[int, pg.PlotDataItem] = {}
        # one item for every chat's stars; the brushes are made once per chat, so pyqtgraph's symbol cache
        # (keyed by brush) renders each star shape once, not on every refresh
        self.ttft_markers = pg.ScatterPlotItem(size=13, symbol="star")
        self.ttft_markers.setZValue(10)
        self.latency_plot.addItem(self.ttft_markers)
        # accepted drafts in one colour for every chat: the point is to see speculation working, not whose it is
        self.draft_markers = pg.ScatterPlotItem(size=7, symbol="d")
        self.draft_markers.setZValue(9)
        self.latency_plot.addItem(self.draft_markers)
        self._brushes: dict[int, object] = {}
        self.histogram_curve = self.histogram_plot.plot(stepMode="center", fillLevel=0)
        self.data: dict[str, np.ndarray] = {}
        self.ttft_by_chat: dict[str, np.ndarray] = {}
        self.itl_by_chat: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def fit_histogram_ticks(self, low: float, high: float) -> None:
        """As many round ticks as the chart's width holds with a gap between their labels: pyqtgraph's own spacing
        printed "20004000" on a narrow chart at 10 pt."""
        axis = self.histogram_plot.getAxis("bottom")
        span = high - low
        if span <= 0:
            axis.setTicks(None)
            return
        metrics = QFontMetrics(QApplication.font())
        label = metrics.horizontalAdvance(f"{max(abs(low), abs(high)):.0f}") + metrics.horizontalAdvance("00")
        length = axis.width() if axis.width() > 1 else 200
        step = nice_step(span / max(1, int(length / (label * 1.5))))
        if step > span:  # not even two labels' room: the ends of the range, roughly
            step = nice_step(span) / (2 if nice_step(span) / 2 <= span else 1)
            while step > span:
                step /= 2
        first = math.ceil(low / step) * step
        values = np.arange(first, high + step * 1e-6, step)
        axis.setTicks([[(float(v), f"{v:g}") for v in values]])

    def plots(self) -> list[pg.PlotItem]:
        return [self.latency_plot, self.histogram_plot]

    def restyle(self) -> None:
        style_plot(self.histogram_plot, self.theme)
        self.histogram_curve.setPen(pg.mkPen(self.theme.decode, width=1))
        self.histogram_curve.setBrush(pg.mkBrush(self.theme.decode + "90"))
        self.ttft_markers.setPen(pg.mkPen(self.theme.foreground, width=1))
        self.draft_markers.setPen(pg.mkPen(self.theme.background, width=1))
        self.draft_markers.setBrush(pg.mkBrush(self.theme.drafted))

    @property
    def selected_chat(self) -> str | None:
        text = self.chat_box.currentText()
        return None if text == ALL_CHATS else text

    def _sync_chat_box(self, chats: list[str]) -> None:
        known = [self.chat_box.itemText(i) for i in range(1, self.chat_box.count())]
        for chat in chats[len(known) :]:
            self.chat_box.addItem(chat or "(untagged)")

    def _curve(self, code: int) -> pg.PlotDataItem:
        if code not in self.itl_curves:
            self.itl_curves[code] = self.latency_plot.plot(pen=pg.mkPen(chat_colour(code), width=1))
            self._brushes[code] = pg.mkBrush(chat_colour(code))
        return self.itl_curves[code]

    def refresh(self, view: WindowView) -> None:
        self._sync_chat_box(view.chats)
        selected = self.selected_chat
        codes = [c for c, name in enumerate(view.chats) if selected is None or (name or "(untagged)") == selected]
        self.itl_by_chat, self.ttft_by_chat = {}, {}
        ttft_x, ttft_y, brushes, all_itl, draft_x, draft_y = [], [], [], [], [], []
        for code, name in enumerate(view.chats):
            chat = chat_latencies(view, code) if code in codes else None
            if chat is not None and (len(chat.t) or len(chat.first_t)):
                self._curve(code).setData(chat.t, chat.itl_s * 1e3, connect=chat.joined, skipFiniteCheck=True)
                self.itl_by_chat[name] = (chat.t, chat.itl_s)
                self.ttft_by_chat[name] = chat.ttft_s
                ttft_x.append(chat.first_t)
                ttft_y.append(chat.ttft_s * 1e3)
                brushes += [self._brushes[code]] * len(chat.first_t)
                all_itl.append(chat.itl_s)
                draft_x.append(chat.t[chat.drafted])
                draft_y.append(chat.itl_s[chat.drafted] * 1e3)
            elif code in self.itl_curves:
                self.itl_curves[code].setData([], [])
        xs = np.concatenate(ttft_x) if ttft_x else np.empty(0)
        ys = np.concatenate(ttft_y) if ttft_y else np.empty(0)
        self.ttft_markers.setData(x=xs, y=ys, brush=brushes)
        draft_t = np.concatenate(draft_x) if draft_x else np.empty(0)
        draft_ms = np.concatenate(draft_y) if draft_y else np.empty(0)
        self.draft_markers.setData(x=draft_t, y=draft_ms)
        itl = np.concatenate(all_itl) if all_itl else np.empty(0)
        edges, counts = itl_histogram(itl)
        self.histogram_curve.setData(edges, counts)
        if len(edges):
            self.fit_histogram_ticks(float(edges[0]), float(edges[-1]))
        self.data = {
            "itl_s": itl,
            "histogram_edges": edges,
            "histogram_counts": counts,
            "ttft_t": xs,
            "ttft_ms": ys,
            "drafted_t": draft_t,
            "drafted_ms": draft_ms,
        }
        set_window(self.latency_plot, view)
        # from zero, so a lone TTFT star does not zoom the axis into a sliver around its value
        top = max([float(ys.max()) if ys.size else 0.0, float(np.percentile(itl, 99.5)) * 1e3 if itl.size else 0.0])
        self.latency_plot.setYRange(0, top * 1.1 if top > 0 else 1.0, padding=0)
        shown = [
            (chat_colour(c), "━", escape(view.chats[c] or "(untagged)"))
            for c in codes
            if view.chats[c] in self.itl_by_chat
        ]
        marks = [(self.theme.foreground, "★", "first token (TTFT)")]
        if draft_t.size:  # said only where speculation is on and its drafts are being accepted
            marks.append((self.theme.drafted, "◆", f"accepted draft ({draft_t.size} tokens)"))
        self.legend.setText(legend_html([*shown, *marks], self.theme.muted))
