"""GuiCollector: Python's cycle collector run by hand in the GUI thread, and not while a model loads."""

from __future__ import annotations

from pyqtgraph.util.garbage_collector import GarbageCollector

from engine import cycle_collector


class GuiCollector(GarbageCollector):
    """pyqtgraph's collector (automatic collection off, generations collected on a timer in the GUI thread, so Qt
    objects die there), except while a load has the collector paused (engine/cycle_collector.py): each check then
    walked what the loading thread had just made, holding the interpreter lock that thread's Python (transformers'
    import, the tokenizer) needed, 0.2 s of the window's 6 s to a first token; the load ends with a collection of
    its own (set_aside_what_is_loaded)."""

    def check(self) -> None:
        if cycle_collector.pausing():
            return
        super().check()
