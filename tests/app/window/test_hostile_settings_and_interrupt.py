"""The desktop with odd settings and a Ctrl+C: every value settings.ini holds that does not fit gives way to its
default with a log line (`[models] default={"spec": 5}` stopped the studio at start, `models/recent=5` raised in a
slot after a load), and SIGINT in the terminal closes the window the way Quit does."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine.domain.model_choice import ModelChoice

HOSTILE_INI = r"""[ui]
theme=purple
font_size=abc
send_key=5
settings_panel=maybe
current_chat=-7
[window]
sidebar_width=wide
geometry=not a geometry
[engine]
kv_memory_mib=-3
page_size=0
max_running=lots
max_step_tokens=1e99
prefix_caching=sometimes
[models]
default="{\"spec\": 5}"
recent=5
[dashboard]
window_s=never
"""


def write_ini(studio_home: Path, text: str) -> None:
    folder = studio_home / "config"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.ini").write_text(text)


def test_every_hostile_value_falls_back_with_a_log_line(studio_home, caplog) -> None:
    from app.window.settings import StudioSettings

    write_ini(studio_home, HOSTILE_INI)
    settings = StudioSettings()
    with caplog.at_level(logging.WARNING):
        values = (settings.theme, settings.font_size, settings.send_key, settings.settings_panel_visible,
                  settings.current_chat, settings.sidebar_width, settings.kv_memory_mib, settings.default_model,
                  settings.recent_models, settings.window_state())  # fmt: skip
        config = settings.engine_config
    # kv_memory_mib falls back to 0: the automatic budget (the default)
    assert values == ("system", 10, "enter", True, None, 0, 0, ModelChoice(), [], (None, None))
    assert config.page_size == 16 and config.max_running == 64 and config.prefix_caching
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for key in ("ui/theme", "ui/font_size", "ui/send_key", "ui/settings_panel", "ui/current_chat",
                "window/sidebar_width", "window/geometry", "engine/kv_memory_mib", "engine/page_size",
                "engine/max_running", "engine/prefix_caching", "models/default", "models/recent"):  # fmt: skip
        assert f"settings: {key} = " in logged, key
    settings.add_recent_model(ModelChoice(spec="/models/a"))  # raised TypeError with recent=5
    assert settings.recent_models == [ModelChoice(spec="/models/a")]


def test_the_window_opens_on_hostile_settings(make_window, studio_home) -> None:
    write_ini(studio_home, HOSTILE_INI)
    window = make_window(load=False)  # the dashboard's window_s=never raised ValueError here
    assert window.settings.default_model == ModelChoice()
    window.settings.add_recent_model(ModelChoice(spec="/models/b"))


def test_ctrl_c_closes_the_window_like_quit(studio_home, tiny_model_dir, tmp_path) -> None:
    """A real studio process: SIGINT once it is open; it closes (saving the window's state) and exits 0. It used to
    go on running: Qt's event loop never let Python's handler run."""
    env = {**os.environ, "INFERENCE_STUDIO_HOME": str(studio_home), "QT_QPA_PLATFORM": "offscreen",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    log_path = tmp_path / "studio.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "-v", "gui", "--model", str(tiny_model_dir)], env=env, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "the window is open" not in log_path.read_text(errors="replace"):
            assert process.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, "the window did not open"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0, log_path.read_text(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert "window/geometry" in (studio_home / "config" / "settings.ini").read_text().replace("\\", "/") or \
        "geometry=" in (studio_home / "config" / "settings.ini").read_text()  # fmt: skip
