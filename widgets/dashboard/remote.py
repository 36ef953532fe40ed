"""Panel: what a remote endpoint reports about itself in its /metrics (vLLM's, llama.cpp's or TGI's names): KV-cache
usage, running and waiting requests, time to first token or the server's output rate, each where the server offers it;
or, for a server without such metrics, that only client-side timings exist."""

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
        "The current chat runs on a remote server. When it serves Prometheus /metrics under vLLM's names (vLLM, "
        "another studio), llama.cpp's (llama-server) or TGI's, this shows what the server itself reports: the "
        "requests it is running and queueing (everyone's, not only yours), its KV-cache usage and mean time to "
        "first token where it reports them, else the tokens per second it generates for everyone. The other "
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
        self.ttft_plot = add_plot(self.graphics, 2, "TTFT ms", TIME_LABEL)  # or the server's tok/s, see below
        self.kv_plot.getAxis("left").setTicks([[(v, str(v)) for v in (0, 50, 100)]])
        for plot in (self.kv_plot, self.requests_plot):
            plot.setXLink(self.ttft_plot)
            hide_time_axis(plot)
        self.kv_plot.setYRange(0, 100, padding=0)
        self.kv_curve = self.kv_plot.plot(fillLevel=0)
        self.running_curve = self.requests_plot.plot()
        self.waiting_curve = self.requests_plot.plot()
        self.ttft_points = self.ttft_plot.plot(pen=None, symbol="o", symbolSize=6)
        self.rate_curve = self.ttft_plot.plot()  # servers without TTFT (llama.cpp, TGI): everyone's output tok/s
        self.bottom = "ttft"
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
        self.rate_curve.setPen(pg.mkPen(th.decode, width=2))
        self._legend()

    def _legend(self) -> None:
        th, latest = self.theme, self.latest
        has_kv = latest is not None and latest.kv_cache_usage is not None
        entries = [(th.used, "■", "KV-cache usage")] if has_kv else []
        entries += [(th.admitted, "━", "running"), (th.prefill, "┅", "waiting")]
        if self.bottom == "ttft":
            entries.append((th.decode, "●", "mean TTFT of requests since the last scrape"))
        else:
            entries.append((th.decode, "━", "tokens per second the server generates (all clients)"))
        self.legend.setText(legend_html(entries, th.muted))

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
            if latest.lacks:
                text += f"; not reported: {escape(', '.join(latest.lacks), quote=False)}"
            self._fit_charts(latest)
        self.status.setText(text)
        self.legend.setVisible(charts)
        self.graphics.setVisible(charts)
        # the panel spans the dashboard's width: tall with charts, a single line without them
        self.setMinimumHeight(CHARTS_HEIGHT if charts else 0)
        vertical = QSizePolicy.Policy.Expanding if charts else QSizePolicy.Policy.Maximum
        self.setSizePolicy(QSizePolicy.Policy.Expanding, vertical)

    def _fit_charts(self, latest: RemoteMetricsSnapshot) -> None:
        """Only the charts the server has figures for: no KV chart without a KV gauge; TTFT, else its output rate."""
        has_kv = latest.kv_cache_usage is not None
        self.kv_plot.setVisible(has_kv)
        grid = self.graphics.ci.layout
        grid.setRowMaximumHeight(0, 1e6 if has_kv else 0)  # a hidden plot's row would still take its share
        grid.setRowSpacing(0, 5 if has_kv else 0)
        bottom = "ttft" if latest.ttft_mean_total_s is not None else "rate"
        if bottom != self.bottom:
            self.bottom = bottom
            self.ttft_plot.setLabel("left", "TTFT ms" if bottom == "ttft" else "server tok/s")
            self._legend()

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
        rate = column(s.generation_tokens_per_s for _, s in shown)
        self.kv_curve.setData(t, np.nan_to_num(kv), connect="finite")
        self.running_curve.setData(t, np.nan_to_num(running), connect="finite")
        self.waiting_curve.setData(t, np.nan_to_num(waiting), connect="finite")
        has_ttft = ~np.isnan(ttft)
        self.ttft_points.setData(t[has_ttft], ttft[has_ttft])
        if self.bottom == "rate":
            self.rate_curve.setData(t, np.nan_to_num(rate), connect="finite")
        else:
            self.rate_curve.setData([], [])
        self.data = {
            "t": t,
            "kv_percent": kv,
            "running": running,
            "waiting": waiting,
            "ttft_ms": ttft,
            "tokens_per_s": rate,
        }
        set_window(self.ttft_plot, view)
