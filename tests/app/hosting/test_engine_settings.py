"""The window's engine takes the engine settings (page size, replies per step, step budget, prefix caching, the
compiled step)."""

from __future__ import annotations

from engine.core.config import EngineConfig


def test_engine_settings_persist_and_reach_the_windows_engine(qtbot, make_window) -> None:
    from app.window.settings import StudioSettings

    settings = StudioSettings()
    assert settings.engine_config == EngineConfig()
    chosen = EngineConfig(page_size=8, max_running=5, max_step_tokens=96, prefix_caching=False, compiled_step=False)
    settings.engine_config = chosen
    settings.sync()
    assert StudioSettings().engine_config == chosen

    window = make_window()  # loads the tiny model with the settings saved above
    engine = window.bridge.thread.engine
    assert engine.config.page_size == 8 and engine.pool.page_size == 8
    assert engine.config.max_running == 5 and engine.config.max_step_tokens == 96
    assert not engine.config.prefix_caching and not engine.pool.enable_caching
    assert engine.runtime_record()["compiled_step"] == "off (not asked for)"
    assert engine.config.kv_memory_bytes == window.bridge.choice.kv_memory_bytes


def test_impossible_engine_settings_fall_back_to_the_defaults(qtbot, studio_home) -> None:
    from app.window.settings import StudioSettings

    settings = StudioSettings()
    settings.qsettings.setValue("engine/page_size", 0)  # a hand-edited file
    assert settings.engine_config == EngineConfig()


def test_the_settings_dialog_edits_the_engine_settings(qtbot, studio_home) -> None:
    from app.hosting.hub_token import KeyringTokens
    from engine.domain.model_choice import ModelChoice
    from widgets.dialogs.settings import SettingsDialog, SettingsValues

    values = SettingsValues("system", 10, "enter", 512, ModelChoice(), EngineConfig(page_size=32))
    dialog = SettingsDialog(values, KeyringTokens())
    qtbot.addWidget(dialog)
    assert dialog.page_size.value() == 32 and dialog.step_tokens.value() == 0  # 0 shows "auto"
    dialog.max_running.setValue(7)
    dialog.step_tokens.setValue(128)
    dialog.prefix_caching.setChecked(False)
    assert dialog.compiled_step.isChecked()
    dialog.compiled_step.setChecked(False)
    engine = dialog.values().engine
    assert (engine.page_size, engine.max_running, engine.max_step_tokens, engine.prefix_caching) == (32, 7, 128, False)
    assert not engine.compiled_step


def test_the_status_bar_shows_what_the_engine_runs(qtbot, make_window) -> None:
    window = make_window()
    record = window.bridge.thread.engine.runtime_record()
    details = window.status.precision.toolTip()
    assert record["forward"] in details and record["fast_path_check"] in details
    assert f"compiled step: {record['compiled_step']}" in details
    assert ("compiled step" in window.status.precision.text()) == record["compiled_step"].startswith("on")
    assert window.status.precision.text().startswith(record["weights"])
    if record["layer_formats"] != [record["weights"]]:
        assert "layers" in window.status.precision.text()
