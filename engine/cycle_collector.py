"""The cycle collector and a loaded model: paused while the process starts and a model loads, and what is alive once
a model is in service set aside from its scans."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_pauses = 0  # paused() calls under way, in any thread
_pauses_lock = threading.Lock()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside. Start-up and loading create objects that live as long as the process (torch's and
    transformers' modules, the model's); every collection the allocations set off walked all of them again: 0.5-0.6 s
    of a 3B model's 4-5 s start. Garbage cycles made meanwhile wait for the next collection (set_aside_what_is_loaded
    runs one once the model serves). Nests, and overlaps between threads (loads side by side): the collector is back
    on once the call that found it on leaves, whatever happens inside."""
    global _pauses
    was_enabled = gc.isenabled()
    gc.disable()
    with _pauses_lock:
        _pauses += 1
    try:
        yield
    finally:
        with _pauses_lock:
            _pauses -= 1
        if was_enabled:
            gc.enable()


def pausing() -> bool:
    """Whether a start-up or a load anywhere in the process has the collector paused: a collector run by hand (the
    window's, in its GUI thread) waits too."""
    return _pauses > 0


_model_set_aside = False  # whether a model's objects are among those frozen (else only the start-up's are)


def set_aside_what_is_imported() -> None:
    """Leave the modules imported so far (torch's, the server's, Qt's: objects that live as long as the process) out
    of every later scan, the first one included: set_aside_what_is_loaded's collection on a server's way to ready
    then walks what the load made, not every module again (it alone took 0.19 s of a 3B GGUF's start; from the
    weights read to the model set aside, the engine's build included, 0.12-0.17 s now against 0.27-0.36).
    No collection here: start-up makes next to no garbage, and what it made stays (a few objects, no weights)."""
    gc.freeze()


def set_aside_what_is_loaded() -> None:
    """Collect once, then leave everything alive now out of the collector's later scans (gc.freeze, as vLLM's server
    does after start-up). A loaded studio holds ~300k objects that live as long as the model (torch, transformers,
    the model's modules, the window's widgets); each full collection walked them all in 60-100 ms with the
    interpreter lock held, which stalled the engine's step and the window alike, every few seconds while replies
    stream. Objects set aside by an earlier call go back first, so a model dropped since is collected here (what
    set_aside_what_is_imported froze stays set aside: no model was among it). Call it from the thread that may
    collect (the window's: Qt objects must die in the GUI thread)."""
    global _model_set_aside
    if _model_set_aside:  # a model dropped since must be found: everything is scanned once again
        gc.unfreeze()
    gc.collect()
    gc.freeze()
    _model_set_aside = True
