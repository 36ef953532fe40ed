"""The window's collector (Python's cycle collector run by hand in the GUI thread) waits while a load anywhere in the
process has the collector paused, and collects again once it ends."""

from __future__ import annotations

import gc
import threading

from app.window.gui_collector import GuiCollector
from engine.cycle_collector import paused, pausing


def test_the_gui_collector_waits_while_a_model_loads_in_another_thread(qapp) -> None:
    collector = GuiCollector(interval=3600)  # its timer far off: checked by hand here
    collections: list[int] = []

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    loading, done = threading.Event(), threading.Event()

    def load() -> None:
        with paused():
            loading.set()
            done.wait(timeout=30)

    loader = threading.Thread(target=load)
    gc.callbacks.append(note)
    try:
        loader.start()
        assert loading.wait(timeout=30) and pausing()
        made = [[] for _ in range(5 * gc.get_threshold()[0])]  # past the youngest generation's threshold
        collector.check()
        assert collections == []  # the loading thread's Python is not held up by a collection
        done.set()
        loader.join(timeout=30)
        assert not pausing()
        more = [[] for _ in range(5 * gc.get_threshold()[0])]
        collector.check()
        assert collections and collections[0] == 0  # the load is over: the youngest generation is collected
        del made, more
    finally:
        done.set()
        gc.callbacks.remove(note)
        collector.timer.stop()
        gc.enable()  # pyqtgraph's collector turned automatic collection off
