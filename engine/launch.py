"""One way to start an engine: the options every command and the window share, checked, loaded, built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.cycle_collector import paused
from engine.load.loader import LoadedModel, Progress, load_model
from engine.load.memory import free_memory_bytes, heap_reused_while_loading
from engine.load.options import LoadOptions, ResolvedOptions, resolve_options
from engine.model import compiled_step

Loader = Callable[..., LoadedModel]
# the decode step's compiler peaks at ~860 MB (g++ -O3, measured): beside a load only where that leaves the load its
# room; with less free, it compiles after the load, as before
BUILD_BESIDE_LOAD_FREE_BYTES = 4 << 30


@dataclass(frozen=True)
class EngineOptions:
    """What to run and how: the model spec (None: the embedded default), load options, engine settings."""

    model: str | None = None
    load: LoadOptions = field(default_factory=LoadOptions)
    config: EngineConfig = field(default_factory=EngineConfig)

    def check(self) -> ResolvedOptions:
        """Refuse impossible settings at once, before anything loads (raises StudioError subclasses)."""
        self.config.validate()
        return resolve_options(self.load)


def start_engine(options: EngineOptions, progress: Progress | None = None, loader: Loader = load_model) -> Engine:
    """Check the options, load the model (converting or downloading as needed) and build its engine."""
    resolved = options.check()
    wants_step = options.config.compiled_step and options.config.optimize
    if wants_step and resolved.device == "cpu" and free_memory_bytes("cpu") >= BUILD_BESIDE_LOAD_FREE_BYTES:
        compiled_step.prepare_in_background()  # the first start's compile runs beside the load, not after it
    with heap_reused_while_loading(), paused():
        loaded = loader(options.model, options.load, progress=progress)
        if wants_step and loaded.info.device == "cpu":
            compiled_step.ensure_loaded(progress)  # the first start compiles it; the runner then finds it loaded
        if progress is not None:
            progress("allocating the KV cache")
        return Engine(loaded, options.config, progress)
