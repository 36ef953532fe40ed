"""ChatController: one chat tab's behaviour: send, stream, stop, regenerate, edit-and-resend, persist."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat.context_fit import fit_conversation, limits_for, overflow_message
from app.chat.context_tracker import ChatContext
from app.chat.reply_router import ReplyRouter
from app.chat.store import ChatStore, StoredChat
from app.hosting.backends import LOCAL, BackendRegistry, ReplyHandle
from engine.domain.chat import ASSISTANT, INTERRUPTED, USER, ChatMessage, ChatSettings, OverflowPolicy
from engine.domain.reply_stats import ReplyStats
from engine.errors import StudioError
from engine.types import FinishReason, RequestStats, TokenEvent
from widgets.chat.panel import ChatPanel
from widgets.notice_bar import ERROR, INFO
from widgets.tokens.data import entries_from_logprobs

log = logging.getLogger(__name__)

# If a stopped reply's final event never comes (its backend died), finish it here after this long.
STOP_GRACE_MS = 5000
# A streaming reply is saved this often, marked interrupted until it ends: a studio killed mid-reply keeps what was
# written up to a few seconds before.
SAVE_INTERVAL_S = 2.0


@dataclasses.dataclass(frozen=True)
class Hold:
    """Something that has the local engine to itself for a while (the engine runs it between steps, so replies
    pause and new ones wait): what it is, in words, and how to stop it."""

    what: str  # "the Capacity experiment"
    stop_label: str
    stop: Callable[[], None]

    def waiting_text(self) -> str:
        return f"waiting for {self.what} (it has the engine to itself)…"

    def notice_text(self) -> str:
        return (
            f"This chat waits for {self.what}, which has the engine to itself while it measures; "
            "its reply goes on as soon as it ends."
        )


class ChatController(QObject):
    title_changed = Signal(str)
    busy_changed = Signal(bool)

    def __init__(self, chat: StoredChat, store: ChatStore, registry: BackendRegistry, router: ReplyRouter) -> None:
        super().__init__()
        self.chat_id = chat.chat_id
        self.title = chat.title
        self.settings = chat.settings
        self.backend_id = chat.backend
        self.messages: list[ChatMessage] = list(chat.messages)
        self._store = store
        self._registry = registry
        self._router = router
        self._reply: ReplyHandle | None = None
        self._reply_index: int | None = None  # the assistant message being written (or queued)
        self._saved_at = 0.0  # when the streaming reply was last saved (or started)
        self._hold: Hold | None = None  # the local engine is busy with something else (an experiment)
        self.panel = ChatPanel()
        self.panel.transcript.set_messages(self.messages)
        self.panel.set_settings(self.settings)
        self.panel.send_requested.connect(self.send)
        self.panel.stop_requested.connect(self.stop)
        self.panel.regenerate_requested.connect(self.regenerate)
        self.panel.edit_requested.connect(self.begin_edit)
        self.panel.settings_changed.connect(self.set_settings)
        self.context = ChatContext(self.panel)

    # ---- state ------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """A reply is streaming or waiting for its backend."""
        return self._reply_index is not None

    @property
    def streaming(self) -> bool:
        return self._reply is not None

    @property
    def request_id(self) -> str | None:
        return self._reply.request_id if self._reply is not None else None

    def _set_busy(self, busy: bool) -> None:
        self.panel.set_busy(busy)
        self.busy_changed.emit(busy)

    # ---- user actions -----------------------------------------------------------------------
    def send(self, text: str) -> bool:
        """Send a message (resending from an edited one if an edit is open). False if a reply is under way."""
        if not text.strip():
            return False
        if self.busy:
            self.panel.show_info("A reply is still being written: stop it (Esc) or wait, then send.")
            return False
        editing = self.panel.editing_index
        if editing is not None:
            self._truncate(editing)
        self.panel.notice.dismiss()
        self._append(ChatMessage(USER, text))
        self.panel.clear_input()
        self.panel.end_edit()
        self._start_reply()
        return True

    def stop(self) -> None:
        """Cancel the reply; what was generated stays (the engine's final event brings the stats)."""
        if self._reply is not None:
            self._reply.cancel()
            self.panel.transcript.set_status(self._reply_index, "stopping…")
            request_id = self._reply.request_id
            QTimer.singleShot(STOP_GRACE_MS, self, lambda: self._force_stop(request_id))  # dies with the tab
        elif self._reply_index is not None:  # still queued: nothing was generated, drop the placeholder
            self._truncate(self._reply_index)
            self._reply_index = None
            self._set_busy(False)

    def regenerate(self) -> None:
        if self.busy or not self.messages or self.messages[-1].role != ASSISTANT:
            return
        self._truncate(len(self.messages) - 1)
        self._start_reply()

    def begin_edit(self, index: int) -> None:
        if self.busy or not (0 <= index < len(self.messages)) or self.messages[index].role != USER:
            return
        self.panel.begin_edit(index, self.messages[index].content)

    def set_settings(self, settings: ChatSettings) -> None:
        changed = settings != self.settings
        self.settings = settings
        self.panel.set_settings(settings)
        self._store.update_chat(self.chat_id, settings=settings)
        if changed:
            self.refresh_context()  # a new system prompt or overflow policy changes what the next request takes

    def set_backend(self, backend_id: str) -> bool:
        """Write this chat's next replies with another backend (a remote endpoint, say). False while one streams."""
        if self.busy:
            return False
        self.backend_id = backend_id
        self._store.update_chat(self.chat_id, backend=backend_id)
        return True

    def rename(self, title: str) -> None:
        title = title.strip()
        if title and title != self.title:
            self.title = title
            self._store.update_chat(self.chat_id, title=title)
            self.title_changed.emit(title)

    # ---- the reply --------------------------------------------------------------------------
    def _append(self, message: ChatMessage) -> int:
        self.messages.append(message)
        index = len(self.messages) - 1
        if message.role == USER:
            self._store.put_message(self.chat_id, index, message)
        self.panel.transcript.append_message(message)
        return index

    def _truncate(self, keep: int) -> None:
        del self.messages[keep:]
        self._store.truncate(self.chat_id, keep)
        self.panel.transcript.truncate(keep)

    def _start_reply(self) -> None:
        # a system prompt typed a moment ago may still sit in the panel's typing pause: take it now
        current = self.panel.sampling.settings()
        if current != self.settings:
            self.set_settings(current)
        self._reply_index = self._append(ChatMessage(ASSISTANT, ""))
        self._saved_at = time.monotonic()  # the first save comes an interval in, not while the stream starts
        # submitted before the busy state is shown: the Send/Stop swap and the tab's title are UI work the engine need
        # not wait for (with sends in a burst, a compare's, each waited for every earlier one's)
        self._submit()
        if self._reply_index is not None:  # not finished at once (a refusal, a context that cannot fit)
            self.panel.transcript.scroll_to_end()
            self._set_busy(True)

    def hold(self, hold: Hold) -> None:
        """The engine is busy with something else: a reply that streams or waits says so, with a Stop for it."""
        self._hold = hold
        if self._reply_index is not None:
            self._show_hold()

    def release(self) -> None:
        hold = self._hold
        if hold is None:
            return
        if self.panel.notice.text == hold.notice_text():
            self.panel.notice.dismiss()
        self._hold = None
        if self._reply_index is not None:
            if self._reply is not None:
                self.panel.transcript.set_status(self._reply_index, "writing…")
            else:
                self.backend_available()

    def _show_hold(self) -> None:
        hold = self._hold
        if hold is None or self._reply_index is None:
            return
        self.panel.transcript.set_status(self._reply_index, hold.waiting_text())
        self.panel.notice.show_message(hold.notice_text(), INFO, (hold.stop_label, hold.stop))

    def _submit(self) -> None:
        index = self._reply_index
        assert index is not None
        if self._hold is not None and self.backend_id == LOCAL:
            self._show_hold()  # sent when it ends: submitted now, it would sit unseen behind it in the engine
            return
        backend = self._registry.get(self.backend_id)
        if backend is None:
            self.panel.transcript.set_status(index, "waiting for the model to load…")
            return
        limits = limits_for(backend)
        policy = self.settings.overflow
        fit = fit_conversation(
            self.settings.system_prompt, self.messages[:index], limits, policy, self.settings.max_tokens
        )
        self.context.measured(fit, limits)
        self.panel.transcript.mark_dropped(fit.dropped, fit.reason)
        if not fit.fits:  # said here, in words, before the engine refuses it with a bare "prompt too long"
            message = overflow_message(fit, limits, policy)
            self._finish(FinishReason.ERROR, None, message)
            action = self._overflow_action(policy) if fit.newest_fits else None
            self.panel.notice.show_message(message, ERROR, action)
            return
        try:
            encoded = {} if fit.prompt_ids is None else {"prompt_ids": fit.prompt_ids}  # what the fit encoded
            handle = backend.submit(
                messages=fit.messages,
                params=self.settings.to_params(),
                tag=self.title,
                sink=self._router.sink,
                **encoded,
            )
        except StudioError as exc:  # bad settings, a prompt that does not fit: this tab's problem only
            self._finish(FinishReason.ERROR, None, str(exc))
            return
        self._reply = handle
        self._router.track(handle.request_id, self)
        self.panel.transcript.set_status(index, "writing…")

    def backend_available(self) -> None:
        """The backend came (back): send the reply that was waiting for it."""
        if self._reply_index is not None and self._reply is None and self._registry.get(self.backend_id):
            self._submit()

    def on_events(self, events: list[TokenEvent]) -> None:
        """This tab's events of one frame: append their text once, finish on the last."""
        if self._reply is None or self._reply_index is None:
            return
        message = self.messages[self._reply_index]
        final = None
        delta = []
        logprobs = []
        for event in events:
            if event.request_id != self._reply.request_id:
                continue
            delta.append(event.text)
            if event.logprobs:  # only when the chat asked for them (its Token probabilities setting)
                logprobs.extend(event.logprobs)
            if event.finished:
                final = event
        if logprobs:
            self.panel.transcript.append_tokens(self._reply_index, entries_from_logprobs(logprobs))
        if delta:
            message.content += "".join(delta)
            self.panel.transcript.set_streaming_text(self._reply_index, message.content)
            self.context.streamed([e for e in events if e.request_id == self._reply.request_id])
            if final is None and time.monotonic() - self._saved_at >= SAVE_INTERVAL_S:
                self._save_partial()
        if final is not None:
            error = final.error
            if final.finish_reason is FinishReason.ERROR and not error:
                error = "the engine failed while writing this reply"
            self._finish(final.finish_reason or FinishReason.STOP, final.stats, error)

    def _save_partial(self) -> None:
        """Store the reply written so far, marked interrupted: its final save replaces the mark."""
        index = self._reply_index
        if index is None or not self.messages[index].content:
            return
        self._saved_at = time.monotonic()
        self._store.put_message(self.chat_id, index, dataclasses.replace(self.messages[index], error=INTERRUPTED))

    def _finish(self, reason: FinishReason, stats: RequestStats | None, error: str | None) -> None:
        index = self._reply_index
        if index is None:
            return
        message = self.messages[index]
        message.finish_reason = reason
        message.stats = ReplyStats.of(stats) if stats is not None else None
        message.error = error
        if self._ran_into_the_context_end(message):  # its stats line says so, not "limit"
            message.stats = replace(message.stats or ReplyStats(), context_full=True)
        if self._reply is not None:
            self._router.untrack(self._reply.request_id)
        self._reply = None
        self._reply_index = None
        self._store.put_message(self.chat_id, index, message)
        self.panel.transcript.set_status(index, "")
        if self._hold is not None and self.panel.notice.text == self._hold.notice_text():
            self.panel.notice.dismiss()  # nothing of this chat waits any more
        self.panel.transcript.update_message(index, message)
        self.context.finished(message.stats)
        self._say_if_the_context_ended(message)
        self._set_busy(False)

    # ---- the context ------------------------------------------------------------------------
    def refresh_context(self) -> None:
        """Count the conversation as it would go out now (a chat opened, a model loaded, a system prompt changed)."""
        backend = self._registry.get(self.backend_id)
        if backend is None or self.busy:
            return
        limits = limits_for(backend)
        fit = fit_conversation(
            self.settings.system_prompt, self.messages, limits, self.settings.overflow, self.settings.max_tokens
        )
        last = self.messages[-1] if self.messages else None
        reply = last.stats.output_tokens if last is not None and last.role == ASSISTANT and last.stats else None
        self.context.measured(fit, limits, reply or 0, reply_in_prompt=reply is not None)
        self.panel.transcript.mark_dropped(fit.dropped, fit.reason)

    def update_kv_pages(self, page_map) -> None:
        self.context.pages(page_map, self.request_id)

    def _overflow_action(self, policy: OverflowPolicy):
        if policy != OverflowPolicy.STOP:
            return None

        def truncate_and_retry() -> None:
            self.set_settings(replace(self.settings, overflow=OverflowPolicy.TRUNCATE_MIDDLE))
            self.regenerate()

        return ("Truncate the middle and retry", truncate_and_retry)

    def _ran_into_the_context_end(self, message: ChatMessage) -> bool:
        used = message.stats.tokens_used if message.stats is not None else 0
        length = self.context.usage.context_tokens
        return message.finish_reason is FinishReason.LENGTH and bool(length) and used >= length - 1

    def _say_if_the_context_ended(self, message: ChatMessage) -> None:
        if message.stats is not None and message.stats.context_full:
            length = self.context.usage.context_tokens
            self.panel.show_info(
                f"The reply stopped at the end of the model's context ({length:,} tokens). To go on, choose "
                "“truncate the middle” or “rolling window” under When full in the chat settings."
            )

    def _force_stop(self, request_id: str) -> None:
        if self._reply is not None and self._reply.request_id == request_id:
            log.warning("no final event for stopped request %s; finishing it here", request_id)
            self._finish(FinishReason.ABORT, None, None)

    def shutdown(self) -> None:
        """The tab or the window closes: stop the reply and keep what was generated."""
        if self._reply is not None:
            self._reply.cancel()
            self._finish(FinishReason.ABORT, None, None)
        elif self._reply_index is not None:
            self._truncate(self._reply_index)
            self._reply_index = None
