"""The start-up check for the system libraries Qt's X11 plugin needs (no Qt is loaded by these tests)."""

from __future__ import annotations

from pathlib import Path

from app.cli import gui
from app.cli.qt_libraries import install_commands, missing_libraries, missing_libraries_message, uses_xcb

PLUGIN = Path("/opt/fake/PySide6/Qt/plugins/platforms/libqxcb.so")


def fake_loader(missing: set[str]):
    """ctypes.CDLL as a system lacking `missing` would answer: the plugin fails on the first missing one."""

    def load(name: str) -> object:
        if name == str(PLUGIN) and missing:
            first = sorted(missing)[0]
            raise OSError(f"{first}: cannot open shared object file: No such file or directory")
        if name in missing:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return object()

    return load


def test_a_missing_cursor_library_is_named_with_the_apt_and_dnf_commands() -> None:
    missing = missing_libraries(PLUGIN, fake_loader({"libxcb-cursor.so.0"}))
    assert missing == ["libxcb-cursor.so.0"]
    message = missing_libraries_message(missing)
    assert "libxcb-cursor.so.0" in message
    assert "sudo apt install libxcb-cursor0" in message
    assert "sudo dnf install xcb-util-cursor" in message


def test_every_missing_library_is_listed_once_in_one_command() -> None:
    missing = missing_libraries(PLUGIN, fake_loader({"libxcb-icccm.so.4", "libxcb-keysyms.so.1"}))
    assert sorted(missing) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    assert install_commands(missing) == [
        "sudo apt install libxcb-icccm4 libxcb-keysyms1",
        "sudo dnf install xcb-util-keysyms xcb-util-wm",
    ]


def test_a_library_only_the_plugin_names_is_still_reported() -> None:
    def load(name: str) -> object:
        if name == str(PLUGIN):
            raise OSError("libxcb-foo.so.3: cannot open shared object file: No such file or directory")
        return object()

    assert missing_libraries(PLUGIN, load) == ["libxcb-foo.so.3"]


def test_nothing_is_reported_when_the_plugin_loads_or_is_not_found(tmp_path: Path) -> None:
    def refuses_everything_but_the_plugin(name: str) -> object:
        if name != str(PLUGIN):
            raise OSError("missing")  # a bundle carrying its own copies: never consulted when the plugin loads
        return object()

    assert missing_libraries(PLUGIN, refuses_everything_but_the_plugin) == []


def test_xcb_is_checked_only_where_qt_will_use_it() -> None:
    assert uses_xcb({"QT_QPA_PLATFORM": "xcb"})
    assert not uses_xcb({"QT_QPA_PLATFORM": "offscreen", "DISPLAY": ":0"})
    assert not uses_xcb({"QT_QPA_PLATFORM": "wayland", "DISPLAY": ":0"})


def test_the_studio_stops_with_the_message_before_qt_loads(monkeypatch, capsys) -> None:
    monkeypatch.setattr(gui, "display_available", lambda: True)
    monkeypatch.setattr(gui, "uses_xcb", lambda: True)
    monkeypatch.setattr(gui, "missing_libraries", lambda: ["libxcb-cursor.so.0"])

    assert gui.launch(gui.argparse.Namespace()) == 1
    assert "sudo apt install libxcb-cursor0" in capsys.readouterr().err
