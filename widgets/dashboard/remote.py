"""Panel: what a remote endpoint reports about itself (vLLM-style /metrics): KV-cache usage, running and waiting
requests, time to first token; or, for a server without such metrics, that only client-side timings exist."""

from __future__ import annotations

import time
from collections.abc import Callable
from html import escape

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QLabel, QSizePolicy

from engine.remote.metrics import RemoteMetricsSnapshot
from widgets.dashboard.data.series import WindowView
from widgets.dashboard.panel import TIME_LABEL, Panel, add_plot, hide_time_axis, legend_html, legend_label, set_window

MAX_SAMPLES = 3600  # an hour of one-second scrapes, more than the longest time window
CHARTS_HEIGHT = 340  # three stacked charts; without charts the panel is one line of text


class RemotePanel(Panel):
    key = "remote"
    title = "Remote endpoint"
    explanation = (
        "The current chat runs on a remote server. When it serves vLLM-style Prometheus /metrics (vLLM, or "
        "another studio), this shows what the server itself reports: its KV-cache usage, the requests it is "
        "running and queueing (everyone's, not only yours) and its mean time to first token. The other "
        "charts show the token timings measured here, on the client."
    )

    def build(self) -> None:
        self.clock: Callable[[], float] = time.monotonic  # the dashboard sets its own (pausable) clock
        self.status = QLabel()
        self.status.setObjectName("dashboard-remote-status")
        self.status.setWordWrap(True)
        self.body.addWidget(self.status)
        self.legend = legend_label()
        self.body.addWidget(self.legend)
        self.graphics = self.new_graphics()
        self.body.addWidget(self.graphics)
        self.kv_plot = add_plot(self.graphics, 0, "KV %")
        self.requests_plot = add_plot(self.graphics, 1, "requests")
        self.ttft_plot = add_plot(self.graphics, 2, "TTFT ms", TIME_LABEL)
        self.kv_plot.getAxis("left").setTicks([[(v, str(v)) for v in (0, 50, 100)]])
        for plot in (self.kv_plot, self.requests_plot):
            plot.setXLink(self.ttft_plot)
            hide_time_axis(plot)
        self.kv_plot.setYRange(0, 100, padding=0)
        self.kv_curve = self.kv_plot.plot(fillLevel=0)
        self.running_curve = self.requests_plot.plot()
        self.waiting_curve = self.requests_plot.plot()
        self.ttft_points = self.ttft_plot.plot(pen=None, symbol="o", symbolSize=6)
        self.label = ""
        self.samples: list[tuple[float, RemoteMetricsSnapshot]] = []  # (clock time received, snapshot)
        self.data: dict[str, np.ndarray] = {}
        self._show_status()

    def plots(self) -> list[pg.PlotItem]:
        return [self.kv_plot, self.requests_plot, self.ttft_plot]

    def restyle(self) -> None:
        th = self.theme
        self.kv_curve.setPen(pg.mkPen(th.used, width=2))
        self.kv_curve.setBrush(pg.mkBrush(th.used + "40"))
        self.running_curve.setPen(pg.mkPen(th.admitted, width=2))
        self.waiting_curve.setPen(pg.mkPen(th.prefill, width=1, style=pg.QtCore.Qt.PenStyle.DashLine))
        self.ttft_points.setSymbolBrush(pg.mkBrush(th.decode))
        self.ttft_points.setSymbolPen(pg.mkPen(th.decode))
        self.legend.setText(
            legend_html(
                [
                    (th.used, "■", "KV-cache usage"),
                    (th.admitted, "━", "running"),
                    (th.prefill, "┅", "waiting"),
                    (th.decode, "●", "mean TTFT of requests since the last scrape"),
                ],
                th.muted,
            )
        )

    # ---- fed by the dashboard --------------------------------------------------------------------
    def set_endpoint(self, label: str) -> None:
        """A new endpoint (or model): forget the old one's samples."""
        self.label = label
        self.samples.clear()
        self._show_status()

    def add(self, snapshot: RemoteMetricsSnapshot) -> bool:
        """Keep a scrape (once: the client hands the same snapshot out until its next scrape); True if new."""
        if self.samples and self.samples[-1][1] is snapshot:
            return False
        self.samples.append((self.clock(), snapshot))
        del self.samples[:-MAX_SAMPLES]
        self._show_status()
        return True

    @property
    def latest(self) -> RemoteMetricsSnapshot | None:
        return self.samples[-1][1] if self.samples else None

    def _show_status(self) -> None:
        latest = self.latest
        name = escape(self.label or "remote endpoint", quote=False)
        if latest is None:
            text, charts = f"<b>{name}</b>: reading its /metrics…", False
        elif not latest.available:
            text, charts = f"<b>{name}</b>: {escape(latest.message, quote=False)}", False
        else:
            text, charts = f"<b>{name}</b>: what the server reports ({escape(latest.message, quote=False)})", True
        self.status.setText(text)
        self.legend.setVisible(charts)
        self.graphics.setVisible(charts)
        # the panel spans the dashboard's width: tall with charts, a single line without them
        self.setMinimumHeight(CHARTS_HEIGHT if charts else 0)
        vertical = QSizePolicy.Policy.Expanding if charts else QSizePolicy.Policy.Maximum
        self.setSizePolicy(QSizePolicy.Policy.Expanding, vertical)

    def refresh(self, view: WindowView) -> None:
        now = self.clock()
        shown = [(t - now, s) for t, s in self.samples if view.start <= t - now <= view.end and s.available]

        def column(values) -> np.ndarray:
            return np.array([np.nan if v is None else v for v in values], dtype=float)

        t = np.array([x for x, _ in shown], dtype=float)
        kv = column(None if s.kv_cache_usage is None else s.kv_cache_usage * 100 for _, s in shown)
        running = column(s.running for _, s in shown)
        waiting = column(s.waiting for _, s in shown)
        ttft = column(None if s.ttft_mean_s is None else s.ttft_mean_s * 1000 for _, s in shown)
        self.kv_curve.setData(t, np.nan_to_num(kv), connect="finite")
        self.running_curve.setData(t, np.nan_to_num(running), connect="finite")
        self.waiting_curve.setData(t, np.nan_to_num(waiting), connect="finite")
        has_ttft = ~np.isnan(ttft)
        self.ttft_points.setData(t[has_ttft], ttft[has_ttft])
        self.data = {"t": t, "kv_percent": kv, "running": running, "waiting": waiting, "ttft_ms": ttft}
        set_window(self.ttft_plot, view)
