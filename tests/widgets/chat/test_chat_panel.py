"""The chat panel as a person uses it: typing while the transcript has focus, a temperature typed into a preset,
the overflow policy setting, the context meter and the marks where history was dropped."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from engine.domain.chat import ChatMessage, ChatSettings, OverflowPolicy
from widgets.chat.context import ContextUsage, describe
from widgets.chat.panel import ChatPanel
from widgets.chat.sampling_panel import SamplingPanel


@pytest.fixture
def panel(qtbot) -> ChatPanel:
    widget = ChatPanel()
    qtbot.addWidget(widget)
    widget.resize(900, 600)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def type_keys(qtbot, text: str) -> None:
    """Each key to whichever widget has the focus at the time, as a keyboard would send it."""
    for char in text:
        qtbot.keyClick(QApplication.focusWidget(), char)


def test_typing_while_the_transcript_has_focus_goes_to_the_message_box(qtbot, panel) -> None:
    panel.transcript.append_message(ChatMessage("assistant", "An earlier reply"))
    message = panel.transcript.views[-1]
    panel.transcript.setFocus()
    QApplication.processEvents()
    assert panel.transcript.hasFocus()
    type_keys(qtbot, "Hello")
    assert panel.input.toPlainText() == "Hello" and panel.input.hasFocus()
    prose = message.prose_views[0]  # a click into a reply's text selects it: focus is there
    prose.setFocus()
    QApplication.processEvents()
    assert QApplication.focusWidget() is prose
    type_keys(qtbot, " there")
    assert panel.input.toPlainText() == "Hello there"


def test_shortcuts_in_the_transcript_are_not_typing(qtbot, panel) -> None:
    panel.transcript.setFocus()
    qtbot.keyClick(panel.transcript, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(panel.transcript, Qt.Key.Key_PageUp)
    assert panel.input.toPlainText() == "" and not panel.input.hasFocus()


def test_a_temperature_typed_while_a_preset_is_selected_is_kept(qtbot) -> None:
    sampling = SamplingPanel()
    qtbot.addWidget(sampling)
    sampling.show()
    echoed: list[ChatSettings] = []

    def controller_echo(settings: ChatSettings) -> None:  # the chat controller sets what it stored back
        echoed.append(settings)
        sampling.set_settings(settings)

    sampling.settings_changed.connect(controller_echo)
    assert sampling.preset.currentText() == "balanced"
    sampling.temperature.setFocus()
    sampling.temperature.selectAll()
    qtbot.keyClicks(sampling.temperature, "0.3")
    assert sampling.temperature.value() == pytest.approx(0.3)
    assert echoed[-1].temperature == pytest.approx(0.3) and sampling.settings().temperature == pytest.approx(0.3)
    assert sampling.preset.currentText() == "custom"  # 0.3 with balanced's other values is no preset


def test_the_overflow_policy_is_a_chat_setting(qtbot) -> None:
    sampling = SamplingPanel()
    qtbot.addWidget(sampling)
    assert sampling.settings().overflow == OverflowPolicy.STOP
    seen: list[ChatSettings] = []
    sampling.settings_changed.connect(seen.append)
    sampling.overflow.setCurrentIndex(sampling.overflow.findData(OverflowPolicy.ROLLING))
    assert seen[-1].overflow == OverflowPolicy.ROLLING
    assert ChatSettings.from_dict({"overflow": "something newer"}).overflow == OverflowPolicy.STOP
    assert (
        ChatSettings.from_dict(ChatSettings(overflow=OverflowPolicy.ROLLING).to_dict()).overflow
        == OverflowPolicy.ROLLING
    )


def test_the_context_meter_says_what_is_used_of_what(panel) -> None:
    usage = ContextUsage(system_tokens=20, history_tokens=300, reply_tokens=80, context_tokens=2048, pages_held=26)
    panel.set_context_usage(usage)
    assert panel.meter.text == "Context 400 / 2,048 tokens (20%) · 26 KV pages held"
    assert panel.meter.bar.isVisibleTo(panel) and panel.meter.bar.value() == 195
    assert "system prompt: 20" in panel.meter.toolTip() and "reply: 80" in panel.meter.toolTip()
    remote = ContextUsage(history_tokens=120, reply_tokens=30, approximate=True)
    panel.set_context_usage(remote)
    assert panel.meter.text == "Context ≈150 tokens used · context unknown"
    assert not panel.meter.bar.isVisibleTo(panel)
    line, _tip = describe(ContextUsage(history_tokens=10, context_tokens=100, pages_cached=3, dropped_messages=4))
    assert line == "Context 10 / 100 tokens (10%) · 3 KV pages cached · 4 earlier messages left out"


def test_a_background_tabs_meter_catches_up_when_its_tab_is_shown(qtbot, monkeypatch) -> None:
    from PySide6.QtWidgets import QTabWidget

    from widgets.chat.context_meter import ContextMeter

    tabs = QTabWidget()
    qtbot.addWidget(tabs)
    front, back = ContextMeter(), ContextMeter()
    tabs.addTab(front, "front")
    tabs.addTab(back, "back")
    tabs.show()
    qtbot.waitExposed(tabs)
    restyled: list[str] = []
    before = back.label.text()  # the empty chat's line, set when it was made
    style = back.bar.style()  # the application's: restored after the test
    monkeypatch.setattr(style, "polish", lambda widget: restyled.append(widget.objectName()))  # a level change
    for used in range(100, 2000, 100):  # a reply streaming in a tab that is not shown
        back.set_usage(ContextUsage(history_tokens=used, context_tokens=2048))
    assert back.label.text() == before and restyled == []  # nothing laid out, styled or tipped meanwhile
    tabs.setCurrentIndex(1)
    assert back.label.text() == "Context 1,900 / 2,048 tokens (93%)"  # the latest, once shown
    assert back.bar.value() == 927 and back.bar.property("level") == "warn" and restyled == ["contextBar"]
    front.set_usage(ContextUsage(history_tokens=5, context_tokens=2048))
    assert front.text == "Context 5 / 2,048 tokens (0%)"  # read while hidden: the latest too


def test_the_transcript_marks_where_history_was_dropped(panel) -> None:
    view = panel.transcript
    for i in range(6):
        view.append_message(ChatMessage("user" if i % 2 == 0 else "assistant", f"message {i}"))
    view.mark_dropped([2, 3], "truncated the middle to fit the context")
    assert view.dropped_markers == [
        "✂ Not sent to the model: the 2 messages below (truncated the middle to fit the context)"
    ]
    assert [bool(v.property("dropped")) for v in view.views] == [False, False, True, True, False, False]
    view.mark_dropped([0, 1, 4])
    assert len(view.dropped_markers) == 2 and "the message below" in view.dropped_markers[1]
    view.truncate(3)
    assert view.dropped_markers == []
