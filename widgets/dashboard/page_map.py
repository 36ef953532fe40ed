"""Panel: the whole KV page pool as a grid, one cell per page, coloured by owning chat; hover names the owner."""

from __future__ import annotations

import math
from collections import Counter
from html import escape

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QToolTip

from engine.core.metrics import PageMap
from widgets.dashboard.data.series import WindowView
from widgets.dashboard.data.theme import blend, chat_colour
from widgets.dashboard.panel import Panel, contained, legend_label

CELL = 7  # pixels per cell side
FILL_LEVELS = 4  # shades of a chat's colour by how full a page is
GAP = 1
UNTAGGED = "(untagged)"


def grid_shape(num_pages: int, aspect: float = 2.2) -> tuple[int, int]:
    """(rows, columns) for the pool, about `aspect` times wider than tall."""
    cols = max(1, math.ceil(math.sqrt(num_pages * aspect)))
    return max(1, math.ceil(num_pages / cols)), cols


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


class _PageImage(pg.ImageItem):
    """The grid image; hovering reports the page under the pointer."""

    def __init__(self, panel: PageMapPanel) -> None:
        super().__init__(axisOrder="row-major")
        self._panel = panel
        self.setAcceptHoverEvents(True)

    @contained
    def hoverEvent(self, event) -> None:
        if event.isExit():
            QToolTip.hideText()
            return
        page = self._panel.page_at(event.pos().x(), event.pos().y())
        text = self._panel.describe_page(page) if page is not None else ""
        if text:
            QToolTip.showText(event.screenPos().toPoint(), text)
        else:
            QToolTip.hideText()


class PageMapPanel(Panel):
    key = "page_map"
    title = "KV page map"
    explanation = (
        "Every page of the KV cache, one cell each, coloured by the chat that holds it (paler while the page "
        "is still filling). A white dot marks a prefix page shared by several requests; amber cells are free "
        "but keep a cached prefix a new request can reuse; grey cells are empty. Hover a cell for details."
    )

    def build(self) -> None:
        self.graphics = self.new_graphics()
        self.graphics.setMinimumHeight(120)
        self.body.addWidget(self.graphics)
        self.view_box = self.graphics.addViewBox(row=0, col=0, lockAspect=True, enableMouse=False)
        self.view_box.invertY(True)
        self.view_box.setMenuEnabled(False)
        self.image = _PageImage(self)
        self.view_box.addItem(self.image)
        self.shared_markers = pg.ScatterPlotItem(size=6, symbol="o", pxMode=True)
        self.view_box.addItem(self.shared_markers)
        self.legend = legend_label()
        self.legend.setWordWrap(True)
        self.body.addWidget(self.legend)
        self.page_map: PageMap | None = None
        self.chat_codes: dict[str, int] = {}
        self.shape = (0, 0)
        self._cells = np.zeros(0, dtype=np.int64)
        self._lut: list[str] = []
        self.counts: Counter[str] = Counter()

    def restyle(self) -> None:
        # a white dot ringed in black reads on every chat colour, in both themes
        self.shared_markers.setPen(pg.mkPen("#000000", width=1))
        self.shared_markers.setBrush(pg.mkBrush("#ffffff"))
        if self.page_map is not None:
            self._draw(self.page_map)

    def refresh(self, view: WindowView) -> None:
        self.chat_codes = {name: code for code, name in enumerate(view.chats)}
        if view.page_map is not self.page_map:
            self._draw(view.page_map)

    # ---- what a cell shows ---------------------------------------------------------------------
    def _tag(self, request_id: str) -> str:
        assert self.page_map is not None
        return self.page_map.tags.get(request_id, "") or UNTAGGED

    def cell_state(self, page: int) -> str:
        """'free', 'cached', 'used' or 'shared'."""
        assert self.page_map is not None
        owners = self.page_map.owners[page]
        if len(owners) > 1:
            return "shared"
        if owners:
            return "used"
        return "cached" if page in self.page_map.cached_pages else "free"

    def owners_of(self, page: int) -> list[str]:
        """Chat tags holding the page, in order, without repeats."""
        assert self.page_map is not None
        return list(dict.fromkeys(self._tag(rid) for rid in self.page_map.owners[page]))

    def describe_page(self, page: int) -> str:
        if self.page_map is None or not 0 <= page < len(self.page_map.owners):
            return ""
        pm = self.page_map
        state = self.cell_state(page)
        head = f"page {page}"
        if state == "free":
            return f"{head}: free"
        if state == "cached":
            return f"{head}: free, keeps a cached prefix page (reusable by a request with the same prompt start)"
        owners = ", ".join(f"{escape(self._tag(rid))} ({rid})" for rid in pm.owners[page])
        tokens = f"{pm.filled[page]}/{pm.page_size} tokens"
        if state == "shared":
            return f"{head}: shared prefix page, held by {owners}; {tokens}"
        cached = ", cached prefix" if page in pm.cached_pages else ""
        return f"{head}: {owners}; {tokens}{cached}"

    def page_at(self, x: float, y: float) -> int | None:
        rows, cols = self.shape
        col, row = int(x // (CELL + GAP)), int(y // (CELL + GAP))
        page = row * cols + col
        if self.page_map is None or not (0 <= col < cols and 0 <= row < rows) or page >= len(self.page_map.owners):
            return None
        return page

    # ---- drawing ---------------------------------------------------------------------------------
    @property
    def cell_colours(self) -> list[str]:
        """Each page's colour (hex), as drawn."""
        return [self._lut[i] for i in self._cells.tolist()]

    def _palette(self, chats: int) -> list[str]:
        """Colour by cell index: 0 free, 1 cached, then per chat FILL_LEVELS + 1 shades, palest when emptiest
        (the unfilled tail of a page is KV waste)."""
        th = self.theme
        lut = [th.page_free, th.page_cached]
        for code in range(chats):
            for level in range(FILL_LEVELS + 1):
                lut.append(blend(chat_colour(code), th.page_free, 0.55 * (1.0 - level / FILL_LEVELS)))
        return lut

    def _draw(self, page_map: PageMap | None) -> None:
        self.page_map = page_map
        if page_map is None:
            self.image.clear()
            self.legend.setText("no pages yet")
            return
        owners = page_map.owners
        n = len(owners)
        # per-page arrays, then one table lookup: no Python work per page beyond reading the owners
        holders = np.fromiter((len(o) for o in owners), dtype=np.int64, count=n)
        unknown = len(self.chat_codes)
        codes = np.fromiter(
            (self.chat_codes.get(page_map.tags.get(o[0], ""), unknown) if o else 0 for o in owners),
            dtype=np.int64,
            count=n,
        )
        cached = np.zeros(n, dtype=bool)
        cached[[p for p in page_map.cached_pages if p < n]] = True
        level = np.clip(np.rint(np.asarray(page_map.filled) / page_map.page_size * FILL_LEVELS), 0, FILL_LEVELS)
        self._cells = np.where(
            holders > 0, 2 + codes * (FILL_LEVELS + 1) + level.astype(np.int64), cached.astype(np.int64)
        )
        self._lut = self._palette(int(codes.max(initial=0)) + 1)
        rows, cols = self.shape = grid_shape(n)
        lut = np.array([_rgb(c) for c in self._lut] + [_rgb(self.theme.page_gap)], dtype=np.uint8)
        cells = np.full(rows * cols, len(self._lut), dtype=np.int64)  # the last entry: the background
        cells[:n] = self._cells
        # each cell becomes a CELL x CELL block with a GAP-wide seam of background to its right and below
        block = np.repeat(np.repeat(cells.reshape(rows, cols), CELL + GAP, axis=0), CELL + GAP, axis=1)
        seam = np.zeros((CELL + GAP, CELL + GAP), dtype=bool)
        seam[CELL:, :] = seam[:, CELL:] = True
        block[np.tile(seam, (rows, cols))] = len(self._lut)
        self.image.setImage(lut[block], autoLevels=False, levels=(0, 255))
        shared = np.flatnonzero(holders > 1)
        centre = CELL / 2
        self.shared_markers.setData(
            x=(shared % cols) * (CELL + GAP) + centre, y=(shared // cols) * (CELL + GAP) + centre
        )
        self.view_box.setRange(xRange=(0, cols * (CELL + GAP)), yRange=(0, rows * (CELL + GAP)), padding=0.02)
        free = holders == 0
        self.counts = Counter(
            shared=int((holders > 1).sum()),
            used=int((holders == 1).sum()),
            cached=int((free & cached).sum()),
            free=int((free & ~cached).sum()),
        )
        self._write_legend(page_map)

    def _write_legend(self, page_map: PageMap) -> None:
        th = self.theme
        holders: Counter[str] = Counter()
        for owners in page_map.owners:
            for tag in dict.fromkeys(self._tag(rid) for rid in owners):
                holders[tag] += 1

        def swatch(colour: str, text: str) -> str:
            return f'<span style="color:{colour}">■</span>&nbsp;{escape(text)}'

        parts = [
            swatch(chat_colour(self.chat_codes.get("" if tag == UNTAGGED else tag, 0)), f"{tag}: {count}")
            for tag, count in holders.items()
        ]
        c = self.counts
        parts.append(f"shared: {c['shared']}")
        parts.append(swatch(th.page_cached, f"cached free: {c['cached']}"))
        parts.append(swatch(th.page_free, f"free: {c['free']}"))
        self.legend.setText(
            f'<span style="color:{th.muted}">{len(page_map.owners)} pages × {page_map.page_size} tokens</span>'
            "&nbsp;&nbsp; " + " &nbsp; ".join(parts)
        )
