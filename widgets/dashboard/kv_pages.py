"""Panel: KV-cache pages over time, used / cached-free / free stacked against the pool total, preemptions marked."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg

from widgets.dashboard.data.series import EVENT_KINDS, WindowView, step_of
from widgets.dashboard.panel import TIME_LABEL, Panel, PhaseMarks, add_plot, legend_html, legend_label, set_window

_PREEMPTED = EVENT_KINDS.index("preempted")


class KVPagesPanel(Panel):
    key = "kv_pages"
    title = "KV pages over time"
    explanation = (
        "The page pool after every step: pages held by requests (used), free pages that still hold a reusable "
        "prompt prefix (cached), and empty free pages, stacked up to the pool size. Pages are handed out as "
        "tokens arrive and come back the moment a reply ends; a red cross marks a preemption (pages ran out)."
    )

    def build(self) -> None:
        self.legend = legend_label()
        self.body.addWidget(self.legend)
        self.graphics = self.new_graphics()
        self.body.addWidget(self.graphics)
        self.plot = add_plot(self.graphics, 0, "pages", TIME_LABEL)
        # back to front: each curve is cumulative and covers the part of the one behind it below its line
        self.free_curve = self.plot.plot(fillLevel=0)
        self.cached_curve = self.plot.plot(fillLevel=0)
        self.used_curve = self.plot.plot(fillLevel=0)
        self.total_curve = self.plot.plot()
        self.preempt_markers = pg.ScatterPlotItem(size=11, symbol="x")
        self.plot.addItem(self.preempt_markers)
        self.data: dict[str, np.ndarray] = {}
        self.phases = PhaseMarks(self.plot)

    def plots(self) -> list[pg.PlotItem]:
        return [self.plot]

    def restyle(self) -> None:
        th = self.theme
        self.phases.restyle(th.muted)
        for curve, colour in (
            (self.free_curve, th.free),
            (self.cached_curve, th.cached_free),
            (self.used_curve, th.used),
        ):
            curve.setPen(pg.mkPen(colour, width=1))
            curve.setBrush(pg.mkBrush(colour))
        self.total_curve.setPen(pg.mkPen(th.total, width=1, style=pg.QtCore.Qt.PenStyle.DashLine))
        self.preempt_markers.setPen(pg.mkPen(th.preempted, width=2))
        self.preempt_markers.setBrush(pg.mkBrush(th.preempted))
        self.legend.setText(
            legend_html(
                [
                    (th.used, "■", "used"),
                    (th.cached_free, "■", "cached (free, reusable prefix)"),
                    (th.muted, "□", "free"),
                    (th.total, "┅", "pool"),
                    (th.preempted, "✕", "preemption"),
                ],
                th.muted,
            )
        )

    def refresh(self, view: WindowView) -> None:
        s = view.steps
        t, used, cached, free, total = (
            s["t"],
            s["pages_used"],
            s["pages_cached_free"],
            s["pages_free"],
            s["pages_total"],
        )
        self.used_curve.setData(t, used, stepMode="left")
        self.cached_curve.setData(t, used + cached, stepMode="left")
        self.free_curve.setData(t, used + cached + free, stepMode="left")
        self.total_curve.setData(t, total, stepMode="left")
        preempt_t = view.events["t"][view.events["kind"] == _PREEMPTED]
        rows = step_of(t, preempt_t)
        self.preempt_markers.setData(x=preempt_t, y=used[rows] if len(t) else np.zeros(len(preempt_t)))
        self.data = {"t": t, "used": used, "cached_free": cached, "free": free, "total": total, "preempt_t": preempt_t}
        if len(total):
            self.plot.setYRange(0, float(total.max()) * 1.05, padding=0)
        self.phases.update(view)
        set_window(self.plot, view)
