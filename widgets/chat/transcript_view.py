"""TranscriptView: a chat's messages in a scroll area that follows the end unless the user has scrolled up; a
transcript that is not shown (a background tab, a chat restored at start) builds its message widgets when it is."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QVBoxLayout, QWidget

from engine.domain.chat import ASSISTANT, ChatMessage
from widgets.chat.message_view import MessageView
from widgets.tokens.data import TokenEntry

# how close to the bottom (pixels) still counts as "at the end"
_FOLLOW_SLACK = 24


class _Unbuilt:
    """A message of a transcript that is not shown, and what its view will show once built: what the view's
    methods were told meanwhile, newest first-class (a streaming text replaces the last; tokens add up)."""

    __slots__ = ("message", "status", "streaming", "tokens")

    def __init__(self, message: ChatMessage) -> None:
        self.message = message
        self.streaming: str | None = None
        self.status: str | None = None
        self.tokens: list[TokenEntry] = []


class TranscriptView(QScrollArea):
    edit_requested = Signal(int)  # index of the user message to edit
    regenerate_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("transcript")
        # The page is sized here, not by QScrollArea's widgetResizable: that sizes it from a word-wrapped
        # label's height at some earlier width and leaves blank space under the last message.
        self.setWidgetResizable(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        container = QWidget()
        container.setObjectName("transcriptPage")
        self._layout = QVBoxLayout(container)
        self._layout.setContentsMargins(16, 12, 16, 12)
        self._layout.setSpacing(10)
        self._placeholder = QLabel("Ask anything. Enter sends, Shift+Enter starts a new line.")
        self._placeholder.setObjectName("placeholder")
        self._placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._placeholder.setWordWrap(True)  # a narrow chat wraps the hint instead of clipping both ends
        self._layout.addWidget(self._placeholder)
        self._layout.addStretch(1)
        self.setWidget(container)
        container.installEventFilter(self)
        self._views: list[MessageView] = []
        # messages after _views that have no widgets yet: a view costs a few milliseconds to build, and sixteen
        # chats sent at once from background tabs held the first replies back by their sum
        self._unbuilt: list[_Unbuilt] = []
        self._dropped_later: tuple[list[int], str] | None = None  # mark_dropped's, until the views are built
        self._markers: list[QLabel] = []  # "history dropped here" lines between messages
        self._busy = False
        self.following = True
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range_changed)
        bar.valueChanged.connect(self._on_value_changed)

    # ---- messages ---------------------------------------------------------------------------
    @property
    def views(self) -> list[MessageView]:
        self._build()
        return list(self._views)

    @property
    def count(self) -> int:
        """Messages in the transcript, built or not."""
        return len(self._views) + len(self._unbuilt)

    def set_messages(self, messages: list[ChatMessage]) -> None:
        self.truncate(0)
        for message in messages:
            self.append_message(message)

    def append_message(self, message: ChatMessage) -> None:
        if self._unbuilt or not self.isVisible():
            self._unbuilt.append(_Unbuilt(message))
            self._placeholder.setVisible(False)
            return
        self._add_view(message)
        self._refresh_actions()

    def _add_view(self, message: ChatMessage) -> MessageView:
        view = MessageView(message)
        view.edit_requested.connect(lambda v=view: self.edit_requested.emit(self._views.index(v)))
        view.regenerate_requested.connect(self.regenerate_requested)
        self._layout.insertWidget(self._layout.count() - 1, view)
        self._views.append(view)
        self._placeholder.setVisible(False)
        return view

    def _build(self) -> None:
        """Widgets for the messages that have none, showing what they were told meanwhile."""
        if not self._unbuilt:
            return
        unbuilt, self._unbuilt = self._unbuilt, []
        for item in unbuilt:
            view = self._add_view(item.message)
            if item.streaming is not None:
                view.set_streaming_content(item.streaming)
            if item.status is not None:
                view.set_status(item.status)
            view.append_tokens(item.tokens)
        self._refresh_actions()
        if self._dropped_later is not None:
            indices, reason = self._dropped_later
            self._dropped_later = None
            self.mark_dropped(indices, reason)

    def _unbuilt_at(self, index: int) -> _Unbuilt | None:
        return self._unbuilt[index - len(self._views)] if index >= len(self._views) else None

    def showEvent(self, event) -> None:
        self._build()  # before the first paint
        super().showEvent(event)

    def update_message(self, index: int, message: ChatMessage) -> None:
        item = self._unbuilt_at(index)
        if item is not None:
            item.message, item.streaming = message, None  # the whole message now: its view renders it once
            return
        self._views[index].set_message(message)
        self._refresh_actions()

    def set_streaming_text(self, index: int, text: str) -> None:
        item = self._unbuilt_at(index)
        if item is not None:
            item.streaming = text
            return
        self._views[index].set_streaming_content(text)

    def append_tokens(self, index: int, entries) -> None:
        """A streaming reply's tokens with their probabilities (TokenEntry list), for its token view."""
        item = self._unbuilt_at(index)
        if item is not None:
            item.tokens.extend(entries)
            return
        self._views[index].append_tokens(entries)

    def set_status(self, index: int, text: str) -> None:
        item = self._unbuilt_at(index)
        if item is not None:
            item.status = text
            return
        self._views[index].set_status(text)

    def truncate(self, count: int) -> None:
        """Keep the first count messages."""
        self.mark_dropped([])
        del self._unbuilt[max(0, count - len(self._views)) :]
        while len(self._views) > count:
            view = self._views.pop()
            self._layout.removeWidget(view)
            view.hide()  # deleted later: until then it would still paint where it was
            view.deleteLater()
        self._placeholder.setVisible(not self._views and not self._unbuilt)
        self._refresh_actions()

    def mark_dropped(self, indices, reason: str = "") -> None:
        """Dim the messages that were left out of the model's context, with a line where each run of them begins."""
        if self._unbuilt and not self.isVisible():
            self._dropped_later = (list(indices), reason)  # applied when the views are built: a long chat's
            return  # history is dropped again on every send, and a background tab would build them each time
        self._build()
        for marker in self._markers:
            self._layout.removeWidget(marker)
            marker.hide()  # deleted later: until then it would still paint where it was
            marker.deleteLater()
        self._markers.clear()
        dropped = set(indices)
        for index, view in enumerate(self._views):
            if bool(view.property("dropped")) != (index in dropped):
                view.setProperty("dropped", index in dropped)
                # the style sheet dims its texts by the property
                for widget in (view, *view.findChildren(QLabel), *view.prose_views):
                    widget.style().unpolish(widget)
                    widget.style().polish(widget)
        runs = [i for i in sorted(dropped) if i < len(self._views) and i - 1 not in dropped]
        for start in runs:
            count = next(n for n in range(1, len(self._views) + 1) if start + n not in dropped)
            what = "message" if count == 1 else f"{count} messages"
            marker = QLabel(f"✂ Not sent to the model: the {what} below ({reason or 'the context is full'})")
            marker.setObjectName("droppedMarker")
            marker.setWordWrap(True)
            marker.setAlignment(Qt.AlignmentFlag.AlignCenter)
            self._layout.insertWidget(self._layout.indexOf(self._views[start]), marker)
            self._markers.append(marker)

    @property
    def dropped_markers(self) -> list[str]:
        self._build()
        return [marker.text() for marker in self._markers]

    def set_busy(self, busy: bool) -> None:
        """While a reply streams, earlier messages can't be edited and nothing can be regenerated."""
        self._busy = busy
        self._refresh_actions()

    def _refresh_actions(self) -> None:
        last = len(self._views) - 1
        for index, view in enumerate(self._views):
            view.set_actions(
                can_edit=not self._busy,
                can_regenerate=not self._busy and index == last and view.message.role == ASSISTANT,
            )

    # ---- page size --------------------------------------------------------------------------
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self._fit_page()
        return super().eventFilter(watched, event)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_page()

    def _fit_page(self) -> None:
        page = self.widget()
        width = self.viewport().width()
        layout = self._layout
        content = layout.totalHeightForWidth(width) if layout.hasHeightForWidth() else layout.totalSizeHint().height()
        size = QSize(width, max(self.viewport().height(), content))
        if page.size() != size:
            page.resize(size)

    # ---- following the end ------------------------------------------------------------------
    def scroll_to_end(self) -> None:
        self.following = True
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self.following:
            self.verticalScrollBar().setValue(maximum)

    def _on_value_changed(self, value: int) -> None:
        self.following = value >= self.verticalScrollBar().maximum() - _FOLLOW_SLACK
