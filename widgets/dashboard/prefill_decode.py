"""Panel: time per step spent on prefill and on decode, tokens per step, and request admit/finish/preempt marks."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg

from widgets.dashboard.data.series import EVENT_KINDS, WindowView, step_of
from widgets.dashboard.data.stats import step_time_split
from widgets.dashboard.panel import (
    TIME_LABEL,
    Panel,
    PhaseMarks,
    add_plot,
    hide_time_axis,
    legend_html,
    legend_label,
    set_window,
)

_SYMBOLS = {"admitted": "t1", "finished": "o", "preempted": "x"}


class PrefillDecodePanel(Panel):
    key = "prefill_decode"
    title = "Prefill vs decode"
    explanation = (
        "Milliseconds per engine step (above): prefill (reading prompts, compute-bound) stacked on decode (one token "
        "per running chat, bandwidth-bound) and the rest of the step (scheduling, sampling). Steps that mix "
        "both split their forward pass by token count. The dashed line is the prefill stall: how much longer the chats "
        "already streaming waited for their token because a new prompt was prefilled in that step. Below: tokens "
        "computed per step, prefill and decode."
    )

    def build(self) -> None:
        self.legend = legend_label()
        self.body.addWidget(self.legend)
        self.graphics = self.new_graphics()
        self.body.addWidget(self.graphics)
        self.time_plot = add_plot(self.graphics, 0, "ms")
        self.token_plot = add_plot(self.graphics, 1, "tokens", TIME_LABEL)
        self.token_plot.setXLink(self.time_plot)
        hide_time_axis(self.time_plot)
        self.graphics.ci.layout.setRowStretchFactor(0, 3)
        self.graphics.ci.layout.setRowStretchFactor(1, 2)
        # drawn back to front: each curve is a cumulative sum, the one in front covers the part below it
        self.total_curve = self.time_plot.plot(fillLevel=0)
        self.prefill_curve = self.time_plot.plot(fillLevel=0)
        self.decode_curve = self.time_plot.plot(fillLevel=0)
        self.stall_curve = self.time_plot.plot()  # in front: the part of the step the streams waited for
        self.markers = {kind: pg.ScatterPlotItem(size=9) for kind in EVENT_KINDS}
        for item in self.markers.values():
            self.time_plot.addItem(item)
        self.prefill_tokens_curve = self.token_plot.plot(name="prefill", fillLevel=0)
        self.decode_tokens_curve = self.token_plot.plot(name="decode", fillLevel=0)
        self.data: dict[str, np.ndarray] = {}
        self.phases = PhaseMarks(self.time_plot)

    def plots(self) -> list[pg.PlotItem]:
        return [self.time_plot, self.token_plot]

    def restyle(self) -> None:
        th = self.theme
        self.phases.restyle(th.muted)
        for curve, colour in (
            (self.total_curve, th.other),
            (self.prefill_curve, th.prefill),
            (self.decode_curve, th.decode),
            (self.prefill_tokens_curve, th.prefill),
            (self.decode_tokens_curve, th.decode),
        ):
            curve.setPen(pg.mkPen(colour, width=1))
            curve.setBrush(pg.mkBrush(colour))
        self.stall_curve.setPen(pg.mkPen(th.preempted, width=2, style=pg.QtCore.Qt.PenStyle.DashLine))
        for kind, colour in (("admitted", th.admitted), ("finished", th.finished), ("preempted", th.preempted)):
            item = self.markers[kind]
            item.setSymbol(_SYMBOLS[kind])
            item.setPen(pg.mkPen(colour, width=2 if kind == "preempted" else 1))
            item.setBrush(pg.mkBrush(colour))
        self.legend.setText(
            legend_html(
                [
                    (th.decode, "■", "decode"),
                    (th.prefill, "■", "prefill"),
                    (th.other, "■", "rest of step"),
                    (th.preempted, "┅", "prefill stall"),
                    (th.admitted, "▲", "admitted"),
                    (th.finished, "●", "finished"),
                    (th.preempted, "✕", "preempted"),
                ],
                th.muted,
            )
        )

    def refresh(self, view: WindowView) -> None:
        split = step_time_split(view)
        t = split.t
        decode_ms, prefill_ms, other_ms = split.decode_s * 1e3, split.prefill_s * 1e3, split.other_s * 1e3
        total_ms = decode_ms + prefill_ms + other_ms
        # a step's figures hold until the next step starts: plateaus, not slopes between points
        self.data = {"t": t, "prefill_ms": prefill_ms, "decode_ms": decode_ms, "other_ms": other_ms}
        self.decode_curve.setData(t, decode_ms, stepMode="left")
        self.prefill_curve.setData(t, decode_ms + prefill_ms, stepMode="left")
        self.total_curve.setData(t, total_ms, stepMode="left")
        stall_ms = view.steps["prefill_stall_s"] * 1e3
        self.stall_curve.setData(t, stall_ms, stepMode="left")
        self.data["stall_ms"] = stall_ms
        prefill_tokens, decode_tokens = view.steps["prefill_tokens"], view.steps["decode_tokens"]
        self.decode_tokens_curve.setData(t, decode_tokens, stepMode="left")
        self.prefill_tokens_curve.setData(t, decode_tokens + prefill_tokens, stepMode="left")
        ev_t, ev_kind = view.events["t"], view.events["kind"]
        rows = step_of(t, ev_t)  # a mark sits on the step it happened in
        heights = total_ms[rows] if len(t) else np.zeros(len(ev_t))
        for code, kind in enumerate(EVENT_KINDS):
            mine = ev_kind == code
            self.markers[kind].setData(x=ev_t[mine], y=heights[mine])
            self.data[f"{kind}_t"] = ev_t[mine]
        self.phases.update(view)
        set_window(self.token_plot, view)
