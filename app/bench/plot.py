"""Draws the benchmark comparison with the dashboard's plotting stack (pyqtgraph, offscreen)."""

from __future__ import annotations

from pathlib import Path

PALETTE = ["#1f77b4", "#17becf", "#aec7e8", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
# one colour per system in every row, so a system is recognised across workloads
SYSTEM_ORDER = [
    "engine-server", "engine-thread", "engine-main", "hf-generate-sequential", "hf-static-batch", "hf-generate-batch",
    "llama-cpp-server", "engine-no-prefix-cache",
]  # fmt: skip
METRICS = (("tokens_per_s", "output tokens/s (higher is better)"), ("ttft_p50_s", "TTFT p50, s (lower is better)"))
ROW_HEIGHT = 260
WIDTH = 1200


def short_name(system: str) -> str:
    """Tick labels that fit under a bar: 'hf-generate-sequential' -> 'one at a time'."""
    names = {
        "engine-server": "studio server",
        "engine-thread": "engine",
        "engine-main": "engine (main)",
        "llama-cpp-server": "llama.cpp server",
        "hf-generate-sequential": "one at a time",
        "hf-static-batch": "static batch",
        "hf-generate-batch": "generate_batch",
        "engine-no-prefix-cache": "no prefix cache",
    }
    return names.get(system, system)


def _colour(system: str) -> str:
    index = SYSTEM_ORDER.index(system) if system in SYSTEM_ORDER else len(SYSTEM_ORDER)
    return PALETTE[index % len(PALETTE)]


def _format(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2f}"


def plot(path: Path, record: dict) -> None:
    """Throughput and TTFT p50 of every system, one row per workload, values written on the bars."""
    import os

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import pyqtgraph as pg
    import pyqtgraph.exporters
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    pg.setConfigOptions(antialias=True, background="w", foreground="k")
    layout = pg.GraphicsLayoutWidget()
    workloads = record["workloads"]
    layout.resize(WIDTH, ROW_HEIGHT * max(1, len(workloads)))
    for index, (name, result) in enumerate(workloads.items()):
        rows = [r for r in result["systems"] if not r.get("skipped") and not r.get("failed")]
        for column, (key, label) in enumerate(METRICS):
            plot_item = layout.addPlot(row=index, col=column, title=f"<b>{name}</b>: {label}")
            plot_item.setMouseEnabled(False, False)
            plot_item.hideButtons()
            values = [r.get(key) or 0.0 for r in rows]
            brushes = [_colour(r["system"]) for r in rows]
            plot_item.addItem(pg.BarGraphItem(x=list(range(len(rows))), height=values, width=0.6, brushes=brushes))
            top = max(values, default=0.0) or 1.0
            for i, value in enumerate(values):
                text = pg.TextItem(_format(value), color="k", anchor=(0.5, 1.0))
                text.setPos(i, value)
                plot_item.addItem(text)
            plot_item.setYRange(0, top * 1.25, padding=0)
            plot_item.setXRange(-0.5, len(rows) - 0.5, padding=0.02)
            plot_item.getAxis("bottom").setTicks([[(i, short_name(r["system"])) for i, r in enumerate(rows)]])
    # the layout gets its final geometry only once shown (offscreen): export after that
    layout.show()
    app.processEvents()
    exporter = pyqtgraph.exporters.ImageExporter(layout.scene())
    exporter.parameters()["width"] = WIDTH
    exporter.export(str(path))
    layout.close()
