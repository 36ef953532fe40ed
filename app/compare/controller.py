"""The Compare window: Model > Compare… runs one prompt on two to four targets and shows the replies side by side,
with their TTFT, tokens per second and a diff."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDialog, QVBoxLayout, QWidget

from app.chat.controller import Hold
from app.compare.diff import Comparison, compare_replies
from app.compare.runner import CompareRun
from app.compare.targets import CompareTarget, compare_targets
from app.window.menus import MenuId, Menus
from engine.types import SamplingParams, TokenEvent
from widgets.compare.compare_view import CompareView
from widgets.tokens.data import TokenEntry, TokenKind

if TYPE_CHECKING:
    from app.chat.tabs import ChatTabs
    from app.hosting.engine_bridge import EngineBridge
    from app.remote.backends import RemoteBackends
    from app.window.settings import StudioSettings


@dataclass(frozen=True)
class CompareHost:
    """What the Compare window uses of the main window."""

    parent: QWidget
    bridge: EngineBridge
    tabs: ChatTabs  # the chats on the engine wait while a comparison runs there
    settings: StudioSettings  # its recent models are targets
    remotes: RemoteBackends | None  # the endpoints' models are targets too, where the window has them
    menus: Menus


def describe_stats(event: TokenEvent) -> str:
    stats = event.stats
    if stats is None:
        return "stopped" if event.error is None else event.error
    parts = [f"TTFT {stats.ttft_s * 1000:.0f} ms" if stats.ttft_s is not None else "TTFT –"]
    if stats.decode_tokens_per_s:
        parts.append(f"{stats.decode_tokens_per_s:.1f} tok/s")
    parts.append(f"{stats.output_tokens} tokens")
    if event.error:
        parts.append(event.error)
    return " · ".join(parts)


class CompareController(QObject):
    run_finished = Signal(object)  # Comparison

    def __init__(self, host: CompareHost) -> None:
        super().__init__(host.parent)
        self.host = host
        self.dialog = QDialog(host.parent)
        self.dialog.setWindowTitle("Compare")
        self.dialog.setObjectName("compareDialog")
        self.view = CompareView()
        QVBoxLayout(self.dialog).addWidget(self.view)
        self.dialog.resize(1100, 640)
        self.view.run_requested.connect(self.run)
        self.view.stop_requested.connect(self.stop)
        self.targets: dict[str, CompareTarget] = {}
        self.current: CompareRun | None = None
        self.replies: list[list[TokenEntry]] = []
        self.tokenizers: list[str | None] = []
        self.finals: list[TokenEvent | None] = []
        self.comparison: Comparison | None = None

    def refresh_targets(self) -> None:
        bridge, remotes = self.host.bridge, self.host.remotes
        choices = remotes.choices() if remotes is not None else []
        thread = bridge.thread
        formats = list(thread.engine.runtime_record()["layer_formats"]) if thread is not None else []
        found = compare_targets(bridge.info, bridge.choice, self.host.settings.recent_models, choices, formats)
        self.targets = {t.key: t for t in found}
        self.view.set_choices([(t.key, t.label, t.name) for t in found])

    def open(self) -> QDialog:
        self.refresh_targets()
        if self.dialog.isVisible():
            self.dialog.raise_()  # already open behind the window: to the front (a new one comes up in front)
        self.dialog.show()
        return self.dialog

    # ---- a run ------------------------------------------------------------------------------
    def run(self, prompt: str, keys: list[str], max_tokens: int) -> bool:
        if self.current is not None and self.current.running:
            return False
        targets = [self.targets[k] for k in keys if k in self.targets]
        if not targets or not prompt.strip():
            return False
        if self.view.prompt.toPlainText() != prompt:  # asked for from outside the view (the self-test, a test)
            self.view.prompt.setPlainText(prompt)
        self.view.set_targets([t.key for t in targets])
        self.view.max_tokens.setValue(max_tokens)
        clients = dict(self.host.remotes.clients) if self.host.remotes is not None else {}
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)  # greedy: differences are the models'
        messages = [{"role": "user", "content": prompt}]
        self.replies = [[] for _ in targets]
        self.tokenizers = [None] * len(targets)
        self.finals = [None] * len(targets)
        self.comparison = None
        self.view.begin([t.name for t in targets], [t.label for t in targets])
        run = CompareRun(targets, messages, params, self.host.bridge.thread, clients, self)
        run.event_arrived.connect(self._on_event)
        run.status_changed.connect(self._on_status)  # a bound method: delivered in this (the GUI) thread
        run.tokenizer_known.connect(self._on_tokenizer)
        self.current = run
        self.view.set_running(True)
        if any(t.local is not None for t in targets):  # they run in the engine thread, one after another
            self.host.tabs.hold("compare", Hold("the comparison (Model > Compare)", "Stop the comparison", self.stop))
            run.finished.connect(lambda: self.host.tabs.release("compare"))
        run.start()
        return True

    def stop(self) -> None:
        if self.current is not None:
            self.current.cancel()

    def _on_status(self, column: int, text: str) -> None:
        if self.finals[column] is None:  # a late "writing…" must not cover the final timings
            self.view.columns[column].set_status(text)

    def _on_tokenizer(self, column: int, key: str) -> None:
        self.tokenizers[column] = key

    def _on_event(self, column: int, event: TokenEvent) -> None:
        if self.finals[column] is not None:
            return
        if event.text or event.token_ids:
            kind = TokenKind.TOKEN if event.token_ids else TokenKind.CHUNK
            entry = TokenEntry(event.text, token_ids=tuple(event.token_ids), kind=kind)
            self.replies[column].append(entry)
            self.view.columns[column].tokens.append_entries([entry])
        if event.finished:
            self.finals[column] = event
            self.view.columns[column].set_status(describe_stats(event), error=bool(event.error))
            if all(final is not None for final in self.finals):  # counted here: signals' order across objects varies
                self._on_finished()

    def _on_finished(self) -> None:
        self.view.set_running(False)
        comparison = compare_replies(self.replies, self.tokenizers)
        for column, entries, marked, summary in zip(
            self.view.columns, comparison.shown, comparison.marked, comparison.summaries, strict=True
        ):
            column.tokens.set_entries(entries, marked)
            column.diff.setText(summary)
        self.comparison = comparison
        self.run_finished.emit(comparison)


def install_compare(host: CompareHost) -> CompareController:
    """Model > Compare… (Ctrl+Shift+K)."""
    controller = CompareController(host)
    action = QAction("Co&mpare models…", host.parent)
    action.setShortcut(QKeySequence("Ctrl+Shift+K"))
    action.setStatusTip("One prompt on two to four models, quantizations or endpoints, side by side")
    action.triggered.connect(lambda _checked=False: controller.open())
    host.parent.addAction(action)
    host.menus.add(MenuId.MODEL, "&Model").addAction(action)
    controller.action = action
    return controller
