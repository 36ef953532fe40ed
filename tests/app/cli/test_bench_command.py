"""`inference-studio bench` end to end on the tiny model: table, JSON record, plot, bad input."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli.main import main


def test_bench_writes_table_json_and_plot(capsys, tiny_model_dir: Path, tmp_path: Path) -> None:
    record_path, plot_path = tmp_path / "bench.json", tmp_path / "bench.png"
    code = main(
        ["bench", "--model", str(tiny_model_dir), "--workload", "single", "--workload", "shared-prefix",
         "--scale", "0.05", "--baselines", "static", "--json", str(record_path), "--plot", str(plot_path)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "## single" in out and "| engine-thread |" in out and "| hf-static-batch |" in out
    assert "engine-thread vs hf-static-batch: throughput_x" in out
    record = json.loads(record_path.read_text())
    assert set(record["workloads"]) == {"single", "shared-prefix"}
    assert record["command"].startswith("inference-studio bench")
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the charts fill the picture: one row per workload (a layout exported before it had its geometry was
    # squeezed into the top corner of a mostly blank image)
    from PySide6.QtGui import QImage

    image = QImage(str(plot_path))
    assert image.width() == 1200 and image.height() >= 2 * 240

    def inked(y: int) -> bool:
        return any(image.pixelColor(x, y).lightness() < 128 for x in range(0, image.width(), 3))

    lowest_ink = next(y for y in range(image.height() - 1, 0, -1) if inked(y))
    assert lowest_ink > image.height() * 0.8


def test_bench_refuses_unknown_names(capsys) -> None:
    assert main(["bench", "--workload", "nope"]) == 2
    assert "unknown workload 'nope'" in capsys.readouterr().err
    assert main(["bench", "--baselines", "static,magic"]) == 2
    assert "unknown baseline 'magic'" in capsys.readouterr().err
