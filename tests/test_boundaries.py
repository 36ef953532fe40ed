"""Package boundaries, checked on the source: the engine never imports Qt or the app; widgets never reach
into engine internals (plain data types only)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QT = ("PySide6", "PyQt5", "PyQt6", "shiboken6", "pyqtgraph")
# data types only (remote_metrics: the snapshot of a remote endpoint's /metrics that the dashboard plots)
WIDGETS_MAY_IMPORT_FROM_ENGINE = {
    "engine.metrics",
    "engine.request",
    "engine.errors",
    "engine.memory",
    "engine.remote_metrics",
}


def imports_of(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", sources("engine"), ids=lambda p: str(p.relative_to(ROOT)))
def test_engine_imports_no_qt_and_no_app(path: Path) -> None:
    for name in imports_of(path):
        top = name.split(".")[0]
        assert top not in QT, f"{path.name} imports {name}: the engine must run headless"
        assert top not in ("app", "widgets"), f"{path.name} imports {name}: the engine must not depend on the app"


@pytest.mark.parametrize("path", sources("widgets"), ids=lambda p: str(p.relative_to(ROOT)))
def test_widgets_use_only_engine_data_types(path: Path) -> None:
    for name in imports_of(path):
        if name.split(".")[0] == "engine":
            assert name in WIDGETS_MAY_IMPORT_FROM_ENGINE, f"{path.name} reaches into {name}"
        assert name.split(".")[0] != "app", f"{path.name} imports {name}: widgets must not depend on the app"
