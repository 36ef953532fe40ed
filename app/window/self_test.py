"""`inference-studio --self-test`: two chats stream at once on the real model; screenshots; the exit status."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication, QWidget

from app.chat.controller import ChatController
from engine.bench.process_watch import process_age_s
from engine.domain.chat import ASSISTANT, ChatSettings
from engine.paths import CACHE_ENV, HOME_ENV, cache_dir

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a short Python function that adds two numbers, in a code block.",
)
SETTINGS = ChatSettings(temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0, max_tokens=64)
TIMEOUT_S = 300
DOCKED_SIZE = (1280, 800)  # studio-docked.png: the window as a laptop shows it, dashboard docked beside the chats
COMPARE_PROMPT = "Why is the sky blue? Answer in two sentences."
COMPARE_TOKENS = 48


def isolate_user_data() -> None:
    """Run on a throwaway home so the user's chats and settings are untouched; keep the real model cache,
    so the embedded model is not converted again. A home set by the caller (tests, installers) is kept."""
    if os.environ.get(HOME_ENV):
        return

    os.environ.setdefault(CACHE_ENV, str(cache_dir()))
    home = tempfile.mkdtemp(prefix="inference-studio-self-test-")
    os.environ[HOME_ENV] = home
    atexit.register(shutil.rmtree, home, ignore_errors=True)


class SelfTest(QObject):
    def __init__(self, window, screenshot_dir: str | None, timeout_s: float = TIMEOUT_S) -> None:
        super().__init__(window)
        self.window = window
        self.folder = Path(screenshot_dir) if screenshot_dir else None
        self.timeout_s = timeout_s
        self.code = 1
        self.reason = "did not finish"
        self.order: list[str] = []
        self.chats: list[ChatController] = []
        self._streaming_shot = False
        self._midstream_shot = False
        self._done = False
        self._streamed = ""
        self.first_token_s: float | None = None  # from the process's start to the first token shown
        # connected before the window starts loading: the failure of a load that fails at once is emitted from the
        # loading thread before the event loop runs, and a connection made after the emit would never hear it
        window.bridge.model_load_failed.connect(self._load_failed)

    def run(self) -> int:
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
        QTimer.singleShot(0, self, self._start)
        timeout_ms = int(self.timeout_s * 1000)
        QTimer.singleShot(timeout_ms, self, lambda: self._end(f"no replies within {self.timeout_s:.0f} s"))
        QApplication.instance().exec()
        if self.code == 0:
            print(f"inference-studio self-test passed: {self.reason}")
        else:
            print(f"inference-studio: self-test failed: {self.reason}", file=sys.stderr)
        return self.code

    def _start(self) -> None:
        tabs = self.window.tabs
        first = tabs.current or tabs.new_chat()
        second = tabs.new_chat()
        self.chats = [first, second]
        self.window.pump.events_arrived.connect(self._on_events)
        # Both messages are sent while the model loads: they queue and go to the engine together.
        for controller, prompt in zip(self.chats, PROMPTS, strict=True):
            controller.set_settings(SETTINGS)
            if not controller.send(prompt):
                self._end(f"{controller.title} could not send its message")
                return
            controller.busy_changed.connect(self._check_done)

    def _load_failed(self, message: str) -> None:
        self._end(f"the model did not load: {message}")

    def _on_events(self, events: list) -> None:
        if self.first_token_s is None and any(event.token_ids for event in events):
            self.first_token_s = process_age_s()  # both messages went out at the start: a user typing at once
        self.order.extend(event.tag for event in events)  # the engine tags each request with its tab's title
        if not self._streaming_shot and all(self._started(c) for c in self.chats):
            self._streaming_shot = True
            self._save(self.window, "studio-streaming.png")
            if self.window.dashboard is not None:
                self.window.resize(*DOCKED_SIZE)
                self.window.dashboard_dock.show()
                self._save(self.window.dashboard, "dashboard-streaming.png")
                self._save(self.window, "studio-docked.png")  # both chats have begun, neither has ended
        elif self._streaming_shot and not self._midstream_shot and self._both_a_few_tokens_in():
            # a few tokens into both replies the charts have something to show: a second dashboard picture
            self._midstream_shot = True
            self.window.dashboard.redraw()  # every panel up to date now, not in its turn
            self._save(self.window.dashboard, "dashboard-midstream.png")
            self._save(self.window, "studio-docked.png")  # a few tokens into both: a fuller picture than at their start

    def _both_a_few_tokens_in(self) -> bool:
        if self.window.dashboard is None or not all(c.busy for c in self.chats):
            return False
        return min(self.order.count(c.title) for c in self.chats) >= 6

    def _started(self, controller: ChatController) -> bool:
        return (
            bool(controller.messages)
            and controller.messages[-1].role == ASSISTANT
            and bool(controller.messages[-1].content)
        )

    def _check_done(self) -> None:
        if self._done or any(c.busy for c in self.chats):
            return
        problems = []
        for controller in self.chats:
            reply = controller.messages[-1] if controller.messages else None
            if reply is None or reply.role != ASSISTANT or not reply.content.strip():
                problems.append(f"{controller.title} got no reply")
            elif reply.error or reply.finish_reason is None or not reply.finish_reason.completed:
                problems.append(f"{controller.title} ended with {reply.finish_reason}: {reply.error}")
        if not problems and "Paris" not in self.chats[0].messages[-1].content:
            problems.append(f"the first reply does not name Paris: {self.chats[0].messages[-1].content[:80]!r}")
        if not problems and not self._interleaved():
            problems.append("the two replies did not stream at the same time")
        if problems:
            self._end("; ".join(problems))
            return
        tokens = [c.messages[-1].stats.output_tokens for c in self.chats if c.messages[-1].stats]
        self._save(self.window, "studio-light.png")
        if self.window.theme is not None:
            mode, size = self.window.theme.mode, self.window.theme.font_size
            self.window.theme.set("dark", size)
            self._save(self.window, "studio-dark.png")
            self.window.theme.set(mode, size)
        first = "" if self.first_token_s is None else f", the first token shown {self.first_token_s:.1f} s after start"
        self._streamed = f"two chats streamed at the same time ({' and '.join(map(str, tokens))} tokens{first})"
        self._compare()

    def _compare(self) -> None:
        """The loaded model against another precision of it, in the Compare window: both must reply."""
        compare = getattr(self.window, "compare", None)
        if compare is None:
            self._end(self._streamed, code=0)
            return
        compare.open()
        local = [key for key, target in compare.targets.items() if target.local is not None]
        if len(local) < 2:
            self._end(f"{self._streamed}; no second local target to compare with", code=0)
            return
        other = "variant:float32:none" if "variant:float32:none" in local else local[1]
        compare.run_finished.connect(self._compared)
        compare.run(COMPARE_PROMPT, [local[0], other], COMPARE_TOKENS)

    def _compared(self, comparison) -> None:
        compare = self.window.compare
        broken = [f"{t.label}: {f.error}" for t, f in zip(compare.current.targets, compare.finals, strict=True)
                  if f is None or f.error or not f.stats or not f.stats.output_tokens]  # fmt: skip
        if broken:
            self._end("the compare view's targets did not both reply: " + "; ".join(broken))
            return
        self._save(compare.dialog, "compare.png")
        self._end(f"{self._streamed}; compared two targets by {comparison.mode}", code=0)

    def _interleaved(self) -> bool:
        ids = [c.title for c in self.chats]
        if any(rid not in self.order for rid in ids):
            return False
        firsts = [self.order.index(rid) for rid in ids]
        lasts = [len(self.order) - 1 - self.order[::-1].index(rid) for rid in ids]
        return max(firsts) < min(lasts)

    def _save(self, widget: QWidget, name: str) -> None:
        if self.folder is None:
            return
        self.window.refresh_status()  # the status bar's own timer may not have run since the last step
        QApplication.processEvents()
        widget.grab().save(str(self.folder / name))

    def _end(self, reason: str, code: int = 1) -> None:
        if self._done:
            return
        self._done = True
        self.code = code
        self.reason = reason
        self.window.close()
        QTimer.singleShot(0, QApplication.instance().quit)
