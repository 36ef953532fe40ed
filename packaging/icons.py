"""Renders resources/icons/inference-studio.svg into the PNG, .ico and .icns files the installers need."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SVG = ROOT / "resources" / "icons" / "inference-studio.svg"
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def render_icons(out: Path) -> dict[str, Path]:
    """Writes inference-studio-<size>.png for each hicolor size, plus .ico (Windows) and .icns (macOS)."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QIcon, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication([])
    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        raise SystemExit(f"cannot read {SVG}")
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    icon = QIcon()
    for size in PNG_SIZES:
        image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        path = out / f"inference-studio-{size}.png"
        if not image.save(str(path)):
            raise SystemExit(f"could not write {path}")
        written[f"png{size}"] = path
        icon.addFile(str(path))
    # Windows wants sizes up to 256 in one .ico; macOS's .icns takes the big ones too.
    ico = QImage(str(written["png256"]))
    written["ico"] = out / "inference-studio.ico"
    if not ico.save(str(written["ico"]), "ICO"):
        raise SystemExit("Qt's ico image plugin is missing; cannot write the Windows icon")
    written["icns"] = out / "inference-studio.icns"
    if not QImage(str(written["png512"])).save(str(written["icns"]), "ICNS"):
        raise SystemExit("Qt's icns image plugin is missing; cannot write the macOS icon")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, help="folder to write the icons into")
    args = parser.parse_args(argv)
    for name, path in render_icons(args.out).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
