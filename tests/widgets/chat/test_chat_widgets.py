"""Chat widgets: the input's send keys, the transcript following the end, streaming without rebuilding, copy."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget

from engine.domain.chat import PRESETS, ChatMessage, ChatSettings
from widgets.chat.message_input import SEND_CTRL_ENTER, ChatInput
from widgets.chat.sampling_panel import SamplingPanel
from widgets.chat.transcript_view import TranscriptView


def test_enter_sends_and_shift_enter_starts_a_new_line(qtbot) -> None:
    box = ChatInput()
    qtbot.addWidget(box)
    sent: list[str] = []
    box.send_requested.connect(sent.append)
    qtbot.keyClicks(box, "first line")
    qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(box, "second line")
    assert sent == [] and box.toPlainText() == "first line\nsecond line"
    qtbot.keyClick(box, Qt.Key.Key_Return)
    assert sent == ["first line\nsecond line"]


def test_ctrl_enter_mode(qtbot) -> None:
    box = ChatInput()
    qtbot.addWidget(box)
    box.set_send_key(SEND_CTRL_ENTER)
    sent: list[str] = []
    box.send_requested.connect(sent.append)
    qtbot.keyClicks(box, "a")
    qtbot.keyClick(box, Qt.Key.Key_Return)
    assert sent == [] and box.toPlainText() == "a\n"
    qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert sent == ["a\n"]
    assert "Ctrl+Enter sends" in box.placeholderText()


def test_blank_input_sends_nothing(qtbot) -> None:
    box = ChatInput()
    qtbot.addWidget(box)
    sent: list[str] = []
    box.send_requested.connect(sent.append)
    qtbot.keyClicks(box, "   ")
    qtbot.keyClick(box, Qt.Key.Key_Return)
    assert sent == []


def _long_transcript(qtbot) -> TranscriptView:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.resize(500, 300)
    view.show()
    for index in range(12):
        view.append_message(ChatMessage("user" if index % 2 == 0 else "assistant", f"message {index}\n" * 3))
    qtbot.waitUntil(lambda: view.verticalScrollBar().maximum() > 0)
    return view


def test_the_transcript_follows_the_end_while_text_streams(qtbot) -> None:
    view = _long_transcript(qtbot)
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())
    old_max = bar.maximum()
    view.set_streaming_text(11, "line\n" * 40)
    qtbot.waitUntil(lambda: bar.maximum() > old_max)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())
    assert view.following


def test_the_transcript_stays_put_when_the_user_scrolled_up(qtbot) -> None:
    view = _long_transcript(qtbot)
    bar = view.verticalScrollBar()
    bar.setValue(0)  # the user scrolls up to read
    assert not view.following
    old_max = bar.maximum()
    view.set_streaming_text(11, "line\n" * 40)
    qtbot.waitUntil(lambda: bar.maximum() > old_max)
    assert bar.value() == 0
    view.scroll_to_end()
    assert view.following and bar.value() == bar.maximum()


def test_streaming_updates_blocks_in_place(qtbot) -> None:
    """Appending text must not rebuild earlier blocks (that is what would make the reply flicker)."""
    view = TranscriptView()
    qtbot.addWidget(view)
    view.append_message(ChatMessage("assistant", ""))
    message_view = view.views[-1]
    view.set_streaming_text(0, "Intro text")
    intro = message_view.prose_views[0]
    view.set_streaming_text(0, "Intro text\n```py\nx = 1")
    qtbot.waitUntil(lambda: bool(message_view.code_views), timeout=2000)  # streaming updates are paced
    code = message_view.code_views[0]
    view.set_streaming_text(0, "Intro text\n```py\nx = 1\ny = 2\n```\nDone.")
    assert message_view.text.endswith("Done.")  # the text at once, its layout at the next paced update
    qtbot.waitUntil(lambda: code.text == "x = 1\ny = 2", timeout=2000)
    assert message_view.prose_views[0] is intro
    assert message_view.code_views[0] is code


def test_a_fast_stream_is_laid_out_a_few_times_a_second(qtbot, monkeypatch) -> None:
    """Tokens arriving every frame would lay the reply out every frame (a quarter of a core on a 2-core machine,
    taken from the engine): the view shows the first at once, then at most one update per STREAM_RENDER_MS, and
    always the last text."""
    from widgets.chat import message_view as module

    view = TranscriptView()
    qtbot.addWidget(view)
    view.append_message(ChatMessage("assistant", ""))
    message_view = view.views[-1]
    layouts: list[str] = []
    real = module.MessageView.set_content
    monkeypatch.setattr(
        module.MessageView, "set_content", lambda self, text, **kw: (layouts.append(text), real(self, text, **kw))
    )
    words = [f"word{i}" for i in range(40)]
    for count in range(1, len(words) + 1):
        view.set_streaming_text(0, " ".join(words[:count]))
    assert layouts == ["word0"]
    qtbot.waitUntil(lambda: layouts[-1] == " ".join(words), timeout=2000)
    assert len(layouts) == 2
    assert message_view.prose_views[0].toPlainText() == " ".join(words)
    # nothing waits now, so nothing is timed: a timer after every render woke the UI thread between frames for nothing
    assert not message_view._render_timer.isActive()
    qtbot.wait(module.STREAM_RENDER_MS + 20)
    view.set_streaming_text(0, " ".join(words) + " more")  # its turn has come: shown at once, no timer
    assert layouts[-1].endswith(" more") and not message_view._render_timer.isActive()


def test_code_blocks_are_monospace_and_copy_to_the_clipboard(qtbot) -> None:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.append_message(ChatMessage("assistant", "Try:\n```sh\nls -la\n```"))
    message_view = view.views[-1]
    code = message_view.code_views[0]
    assert code.editor.font().fixedPitch() or code.editor.fontInfo().fixedPitch()
    code.copy_button.click()
    assert QGuiApplication.clipboard().text() == "ls -la"
    message_view.copy_button.click()
    assert QGuiApplication.clipboard().text() == "Try:\n```sh\nls -la\n```"


def test_only_the_last_reply_offers_regenerate_and_nothing_while_busy(qtbot) -> None:
    view = TranscriptView()
    qtbot.addWidget(view)
    for role in ("user", "assistant", "user", "assistant"):
        view.append_message(ChatMessage(role, role))
    regenerate = [v.regenerate_button.isVisibleTo(v) for v in view.views]
    assert regenerate == [False, False, False, True]
    view.set_busy(True)
    assert not any(v.regenerate_button.isVisibleTo(v) for v in view.views)
    assert not any(v.edit_button.isEnabled() for v in view.views if v.message.role == "user")


def test_presets_set_sampling_and_leave_the_system_prompt(qtbot) -> None:
    panel = SamplingPanel()
    qtbot.addWidget(panel)
    panel.set_settings(ChatSettings(system_prompt="Be brief.", max_tokens=99))
    changes: list[ChatSettings] = []
    panel.settings_changed.connect(changes.append)
    panel.preset.setCurrentText("creative")
    assert changes[-1].temperature == PRESETS["creative"]["temperature"]
    assert changes[-1].system_prompt == "Be brief." and changes[-1].max_tokens == 99
    panel.temperature.setValue(0.3)
    assert panel.preset.currentText() == "custom" and changes[-1].temperature == 0.3
    panel.seed.setValue(42)
    assert changes[-1].seed == 42 and changes[-1].to_params().seed == 42


def test_building_messages_opens_no_stray_windows(qtbot) -> None:
    """A button made visible before it has a parent pops up as a window of its own and steals activation."""
    host = QWidget()
    qtbot.addWidget(host)
    host.show()
    host.activateWindow()
    qtbot.waitUntil(host.isActiveWindow)
    view = TranscriptView(host)
    view.append_message(ChatMessage("user", "hi"))
    view.append_message(ChatMessage("assistant", "```\nx\n```", error="oops"))
    view.set_busy(True)
    view.set_busy(False)
    qtbot.wait(50)
    assert host.isActiveWindow()


def test_presence_and_frequency_penalties_are_chat_settings(qtbot) -> None:
    panel = SamplingPanel()
    qtbot.addWidget(panel)
    changes: list[ChatSettings] = []
    panel.settings_changed.connect(changes.append)
    panel.preset.setCurrentText("precise")
    panel.presence_penalty.setValue(0.6)
    panel.frequency_penalty.setValue(-0.4)
    assert panel.preset.currentText() == "custom"  # a preset has no penalties
    params = changes[-1].to_params()
    assert (params.presence_penalty, params.frequency_penalty) == (0.6, -0.4)
    stored = ChatSettings.from_dict(changes[-1].to_dict())
    assert (stored.presence_penalty, stored.frequency_penalty) == (0.6, -0.4)
    panel.preset.setCurrentText("balanced")
    assert (changes[-1].presence_penalty, changes[-1].frequency_penalty) == (0.0, 0.0)
    assert panel.presence_penalty.value() == 0.0
    # a hand-edited or older store: out of range is clamped, nonsense is off
    odd = ChatSettings.from_dict({"presence_penalty": 7, "frequency_penalty": "lots"})
    assert (odd.presence_penalty, odd.frequency_penalty) == (2.0, 0.0)
    assert ChatSettings.from_dict({}).to_params().presence_penalty == 0.0
