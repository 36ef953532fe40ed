"""Panel: output tokens per second of the whole engine, and the running batch size, on one time axis."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg

from widgets.dashboard.data.series import WindowView
from widgets.dashboard.data.stats import bin_width_for, token_rate
from widgets.dashboard.panel import TIME_LABEL, Panel, add_plot, hide_time_axis, legend_html, legend_label, set_window


class ThroughputPanel(Panel):
    key = "throughput"
    title = "Throughput"
    explanation = (
        "Output tokens per second of the whole engine (all chats together) above, the number of requests in "
        "the running batch below. One more chat adds a row to every decode pass: the total rises, while each "
        "stream's own speed (see Per-token streaming) changes little."
    )

    def build(self) -> None:
        self.legend = legend_label()
        self.body.addWidget(self.legend)
        self.graphics = self.new_graphics()
        self.body.addWidget(self.graphics)
        self.rate_plot = add_plot(self.graphics, 0, "tok/s")
        self.batch_plot = add_plot(self.graphics, 1, "running", TIME_LABEL)
        self.batch_plot.setXLink(self.rate_plot)
        hide_time_axis(self.rate_plot)
        self.graphics.ci.layout.setRowStretchFactor(0, 3)
        self.graphics.ci.layout.setRowStretchFactor(1, 2)
        self.rate_curve = self.rate_plot.plot(fillLevel=0)
        self.running_curve = self.batch_plot.plot()
        self.waiting_curve = self.batch_plot.plot()
        self.data: dict[str, np.ndarray] = {}

    def plots(self) -> list[pg.PlotItem]:
        return [self.rate_plot, self.batch_plot]

    def restyle(self) -> None:
        th = self.theme
        self.rate_curve.setPen(pg.mkPen(th.decode, width=2))
        self.rate_curve.setBrush(pg.mkBrush(th.decode + "40"))
        self.running_curve.setPen(pg.mkPen(th.admitted, width=2))
        self.waiting_curve.setPen(pg.mkPen(th.prefill, width=1, style=pg.QtCore.Qt.PenStyle.DashLine))
        self.legend.setText(
            legend_html(
                [
                    (th.decode, "■", "output tokens/s (all chats)"),
                    (th.admitted, "━", "running"),
                    (th.prefill, "┅", "waiting"),
                ],
                th.muted,
            )
        )

    def refresh(self, view: WindowView) -> None:
        window = view.end - view.start
        centres, rate = token_rate(view, bin_width_for(window))
        self.rate_curve.setData(centres, rate)
        t = view.steps["t"]
        running, waiting = view.steps["running"], view.steps["waiting"]
        # the batch holds its size until the next step: draw it as steps, not slopes
        self.running_curve.setData(t, running, stepMode="left")
        self.waiting_curve.setData(t, waiting, stepMode="left")
        self.data = {"rate_t": centres, "tokens_per_s": rate, "t": t, "running": running, "waiting": waiting}
        set_window(self.batch_plot, view)
