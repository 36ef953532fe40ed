"""EngineBridge: loads models in the background and owns the live EngineThread, swapping it when asked."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat.event_pump import EventPump
from app.hosting.backends import LOCAL, BackendRegistry
from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.core.engine_thread import EngineThread
from engine.core.metrics import MetricsRecorder
from engine.cycle_collector import set_aside_what_is_loaded
from engine.domain.model_choice import ModelChoice
from engine.errors import StudioError
from engine.launch import EngineOptions, Loader, start_engine
from engine.load.loader import ModelInfo, load_model

log = logging.getLogger(__name__)

WATCH_MS = 500  # how often the window looks whether the engine thread died (and was started again)


def engine_options_for(choice: ModelChoice, config: EngineConfig) -> EngineOptions:
    """The picker's choice (model, dtype, quantization, device, KV budget) on the studio's engine settings."""
    budget = choice.kv_memory_bytes or None  # 0: automatic
    return EngineOptions(choice.spec, choice.load_options, replace(config, kv_memory_bytes=budget, kv_pages=None))


class EngineBridge(QObject):
    """One local engine at a time. A new model loads beside the old one; the old keeps serving until the
    window calls complete_swap() (after in-flight replies finished or were stopped); a failed load leaves it."""

    load_started = Signal(str)  # label of what is loading
    load_progress_changed = Signal(str)
    model_ready = Signal()  # a loaded model waits for complete_swap()
    model_changed = Signal(object)  # ModelInfo of the engine now taking requests
    model_load_failed = Signal(str)
    engine_failed = Signal(str)  # the engine thread died: started again, or down for good (the message says which)
    _loaded = Signal(object)
    _failed = Signal(str)
    _old_engine_gone = Signal(object)

    def __init__(
        self,
        registry: BackendRegistry,
        pump: EventPump,
        loader: Loader = load_model,
        engine_config: Callable[[], EngineConfig] = EngineConfig,
    ) -> None:
        """engine_config: the engine settings a model is loaded with, asked for at each load (the settings)."""
        super().__init__()
        self._registry = registry
        self._pump = pump
        self._loader = loader
        self._engine_config = engine_config
        self._thread: EngineThread | None = None
        self._candidate: tuple[ModelChoice, Engine] | None = None
        self._loading: ModelChoice | None = None
        self._closed = False
        self.choice: ModelChoice | None = None
        self.info: ModelInfo | None = None
        self._loaded.connect(self._on_loaded)
        self._failed.connect(self._on_failed)
        self._old_engine_gone.connect(self._on_old_engine_gone)
        self._seen_restarts = 0
        self._reported_down = False
        self._watch = QTimer(self, interval=WATCH_MS)
        self._watch.timeout.connect(self.check_engine)
        self._watch.start()

    # ---- state ------------------------------------------------------------------------------
    @property
    def thread(self) -> EngineThread | None:
        """The engine thread serving chats now (the old one while a swap waits)."""
        return self._thread

    @property
    def loading(self) -> ModelChoice | None:
        return self._loading

    @property
    def swap_pending(self) -> bool:
        return self._candidate is not None

    def metrics(self) -> MetricsRecorder | None:
        """The live engine's metrics ring buffer, for the status bar and the dashboard."""
        return self._thread.metrics if self._thread is not None else None

    def check_engine(self) -> None:
        """Tell the window when the engine thread died since the last look (EngineThread starts it again)."""
        thread = self._thread
        if thread is None or self._closed:
            return
        crash = thread.last_crash or "unknown error"
        if thread.restarts > self._seen_restarts:
            self._seen_restarts = thread.restarts
            self.engine_failed.emit(
                f"The engine failed ({crash}) and was started again; replies being written then were lost."
            )
        elif not thread.alive and not self._reported_down:
            self._reported_down = True
            self.engine_failed.emit(
                f"The engine stopped ({crash}) and could not be started again: load the model again (Model menu)."
            )

    # ---- loading ----------------------------------------------------------------------------
    def load(self, choice: ModelChoice) -> bool:
        """Start loading in the background; False if a load or a swap is already under way."""
        if self._loading is not None or self._candidate is not None or self._closed:
            return False
        self._loading = choice
        self.load_started.emit(choice.label)
        worker = threading.Thread(target=self._load, args=(choice,), name="model-loader", daemon=True)
        worker.start()
        return True

    def _load(self, choice: ModelChoice) -> None:
        try:
            options = engine_options_for(choice, self._engine_config())
            engine = start_engine(options, progress=self._report_progress, loader=self._loader)
        except StudioError as exc:
            self._send(self._failed, str(exc))
            return
        except Exception as exc:  # a bug or an exotic model: say what happened, keep the window
            log.exception("loading %s failed", choice.spec)
            self._send(self._failed, f"could not load {choice.label}: {type(exc).__name__}: {exc}")
            return
        self._send(self._loaded, (choice, engine))

    def _report_progress(self, text: str) -> None:
        self._send(self.load_progress_changed, text)

    @staticmethod
    def _send(signal, value) -> None:
        try:
            signal.emit(value)
        except RuntimeError:  # the window was closed while the model loaded: nobody is listening
            log.debug("load finished after the window closed")

    def _on_loaded(self, result: tuple[ModelChoice, Engine]) -> None:
        self._loading = None
        if self._closed:
            return
        self._candidate = result
        if self._thread is None:
            self.complete_swap()
            return
        self._registry.set(LOCAL, None)  # new messages wait for the new model
        self.model_ready.emit()

    def adopt(self, choice: ModelChoice, engine: Engine) -> None:
        """Put an engine that was started elsewhere in service, as a finished load would (the window's benchmark
        path runs the model it already loaded)."""
        self._on_loaded((choice, engine))

    def _on_failed(self, message: str) -> None:
        self._loading = None
        if not self._closed:
            self.model_load_failed.emit(message)

    def complete_swap(self) -> None:
        """Put the loaded model in service; the old engine thread stops in the background."""
        if self._candidate is None:
            return
        choice, engine = self._candidate
        self._candidate = None
        old = self._thread
        if old is not None:
            # handed over in a list the thread empties: a Thread keeps its args until its target returns, and the
            # old engine must be unreferenced by the time the GUI thread collects it
            threading.Thread(target=self._retire, args=([old],), name="engine-shutdown", daemon=True).start()
        thread = EngineThread(engine, name="engine")
        thread.start()
        self._thread = thread
        self._seen_restarts, self._reported_down = 0, False
        self.choice = choice
        self.info = engine.loaded.info
        self._registry.set(LOCAL, thread, label=self.info.name)
        self.model_changed.emit(self.info)
        if old is None:
            set_aside_what_is_loaded()  # else once the old engine is gone: set aside now, it would never be collected

    def _retire(self, handed: list[EngineThread]) -> None:
        old = handed.pop()
        old.shutdown()
        del old  # nothing here holds the old engine while the GUI thread collects it
        self._send(self._old_engine_gone, None)

    def _on_old_engine_gone(self, _: object) -> None:
        set_aside_what_is_loaded()  # here, in the GUI thread: the old engine's objects collected, the new set aside

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine (cancelling what runs); a load still under way is abandoned."""
        self._closed = True
        self._watch.stop()
        self._candidate = None
        thread, self._thread = self._thread, None
        self._registry.set(LOCAL, None)
        if thread is not None:
            thread.shutdown(timeout)
            self._pump.flush()
