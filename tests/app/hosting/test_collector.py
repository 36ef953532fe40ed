"""What a loaded model leaves to Python's cycle collector: set aside from its scans once it serves (each full
collection walked every object of torch, transformers and the model with the interpreter lock held), and a replaced
model's objects collected, not kept."""

from __future__ import annotations

import gc
import weakref

from app.hosting.model_switcher import STOP


def test_the_model_in_service_is_set_aside_and_a_replaced_one_is_collected(qtbot, make_window, tiny_choice) -> None:
    window = make_window()
    assert gc.get_freeze_count() > 10_000  # torch, transformers, the model, the window: out of the collector's scans
    old_model = weakref.ref(window.bridge.thread.engine.model)
    assert window.load_model(tiny_choice, policy=STOP)
    qtbot.waitUntil(lambda: old_model() is None, timeout=30_000)  # collected in the GUI thread once its engine stopped
    assert gc.get_freeze_count() > 10_000  # and the new one set aside


def test_set_aside_objects_that_die_are_collected_by_the_next_set_aside() -> None:
    from engine.cycle_collector import set_aside_what_is_loaded

    class Node:
        pass

    node = Node()
    node.cycle = node  # only the collector frees a cycle
    dead = weakref.ref(node)
    set_aside_what_is_loaded()
    del node
    gc.collect()
    assert dead() is not None  # set aside: a collection leaves it
    set_aside_what_is_loaded()
    assert dead() is None
