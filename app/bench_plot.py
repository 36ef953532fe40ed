"""Draws the benchmark comparison with the dashboard's plotting stack (pyqtgraph, offscreen)."""

from __future__ import annotations

from pathlib import Path


def plot(path: Path, record: dict) -> None:
    """Throughput and TTFT p50 of every system, one group per workload, drawn with pyqtgraph (offscreen)."""
    import os

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import pyqtgraph as pg
    import pyqtgraph.exporters
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    pg.setConfigOptions(antialias=True, background="w", foreground="k")
    layout = pg.GraphicsLayoutWidget()
    layout.resize(1200, 360 * len(record["workloads"]))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    for index, (name, result) in enumerate(record["workloads"].items()):
        rows = [r for r in result["systems"] if not r.get("skipped")]
        for column, (key, label) in enumerate((("tokens_per_s", "output tok/s"), ("ttft_p50_s", "TTFT p50 (s)"))):
            plot_item = layout.addPlot(row=index, col=column, title=f"{name}: {label}")
            values = [r.get(key) or 0 for r in rows]
            bars = pg.BarGraphItem(
                x=list(range(len(rows))), height=values, width=0.6, brushes=[palette[i % 6] for i in range(len(rows))]
            )
            plot_item.addItem(bars)
            plot_item.getAxis("bottom").setTicks([[(i, r["system"]) for i, r in enumerate(rows)]])
    exporter = pyqtgraph.exporters.ImageExporter(layout.scene())
    exporter.parameters()["width"] = 1200
    app.processEvents()
    exporter.export(str(path))
