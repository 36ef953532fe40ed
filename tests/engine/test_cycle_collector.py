"""The cycle collector pauses while the process starts and a model loads, and is back on afterwards whatever
happened: a load that raises, loads side by side on two threads, pauses inside pauses."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading

import pytest

from engine.cycle_collector import paused
from engine.errors import ModelFormatError
from engine.launch import EngineOptions, start_engine


@pytest.fixture(autouse=True)
def collector_on():
    gc.enable()
    yield
    gc.enable()


def test_a_pause_ends_on_the_way_out_even_by_an_exception() -> None:
    with pytest.raises(RuntimeError), paused():
        assert not gc.isenabled()
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause found it off: it leaves it off
        raise RuntimeError("a step of the load failed")
    assert gc.isenabled()


def test_overlapping_pauses_on_two_threads_leave_it_on_in_either_order() -> None:
    for first_out in ("main", "thread"):
        entered, leave = threading.Event(), threading.Event()

        def other(entered: threading.Event, leave: threading.Event) -> None:
            with paused():
                entered.set()
                leave.wait(timeout=10)

        worker = threading.Thread(target=other, args=(entered, leave))
        if first_out == "thread":  # the thread pauses first, the main thread inside its pause
            worker.start()
            assert entered.wait(timeout=10)
            with paused():
                leave.set()
                worker.join(timeout=10)
        else:
            with paused():
                worker.start()
                assert entered.wait(timeout=10)
            leave.set()
            worker.join(timeout=10)
        assert not worker.is_alive() and gc.isenabled()


def test_a_load_runs_with_the_collector_paused_and_a_failed_one_turns_it_back_on() -> None:
    seen = []

    def failing_loader(spec, options, progress=None):
        seen.append(gc.isenabled())
        raise ModelFormatError("the file ends inside tensor 3")

    with pytest.raises(ModelFormatError):
        start_engine(EngineOptions(), loader=failing_loader)
    assert seen == [False] and gc.isenabled()


def test_the_command_imports_its_modules_with_the_collector_paused_then_runs_with_it_on() -> None:
    code = (
        "import gc, sys\n"
        "during_import = []\n"
        "def note(phase, info):\n"
        "    module = sys.modules.get('app.cli.main')\n"
        "    if phase == 'start' and module is not None and not hasattr(module, 'main'):\n"
        "        during_import.append(info['generation'])\n"
        "gc.callbacks.append(note)\n"
        "sys.argv = ['inference-studio', '--version']\n"
        "from app.cli import entry\n"
        "try:\n"
        "    entry.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(len(during_import), gc.isenabled())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    collections, enabled = done.stdout.split()[-2:]
    assert collections == "0"  # torch, transformers' and the server's modules imported without one collection
    assert enabled == "True"  # the command itself runs with the collector on


def test_what_start_up_froze_is_not_walked_again_until_a_model_was_set_aside(monkeypatch) -> None:
    import weakref

    from engine import cycle_collector

    class Node:
        pass

    monkeypatch.setattr(cycle_collector, "_model_set_aside", False)  # as a process that has not loaded a model yet
    node = Node()
    node.cycle = node  # only the collector frees a cycle
    dead = weakref.ref(node)
    cycle_collector.set_aside_what_is_imported()
    del node
    cycle_collector.set_aside_what_is_loaded()
    assert dead() is not None  # the first model's collection walks what the load made, not the start-up's objects
    cycle_collector.set_aside_what_is_loaded()  # a model is among the frozen now: all of it is walked again
    assert dead() is None
