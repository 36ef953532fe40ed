"""The cycle collector and a loaded model: what is alive once a model is in service is set aside from its scans."""

from __future__ import annotations

import gc


def set_aside_what_is_loaded() -> None:
    """Collect once, then leave everything alive now out of the collector's later scans (gc.freeze, as vLLM's server
    does after start-up). A loaded studio holds ~300k objects that live as long as the model (torch, transformers,
    the model's modules, the window's widgets); each full collection walked them all in 60-100 ms with the
    interpreter lock held, which stalled the engine's step and the window alike, every few seconds while replies
    stream. Objects set aside by an earlier call go back first, so a model dropped since is collected here. Call it
    from the thread that may collect (the window's: Qt objects must die in the GUI thread)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
