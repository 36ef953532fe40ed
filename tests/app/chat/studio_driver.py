"""A real studio window, offscreen, that sends one long message and streams until it is killed: the subject of the
kill -9 test. Run as `python -m tests.app.chat.studio_driver MODEL_DIR MAX_TOKENS` with INFERENCE_STUDIO_HOME set."""

from __future__ import annotations

import dataclasses
import os
import sys
import time


def main(argv: list[str]) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from app.window.main_window import MainWindow
    from app.window.settings import StudioSettings
    from engine.domain.chat import ChatSettings
    from engine.domain.model_choice import ModelChoice

    model_dir, max_tokens = argv[0], int(argv[1])
    app = QApplication(["studio-driver"])
    original = ChatSettings.to_params
    # random weights may end a reply at any token: this one must run until the process is killed
    ChatSettings.to_params = lambda self: dataclasses.replace(original(self), ignore_eos=True)
    # ... and still be streaming seconds later however fast this machine and its kernels are: 5 ms a step
    from engine.core.engine import Engine

    step = Engine.step
    Engine.step = lambda self: (time.sleep(0.005), step(self))[1]
    window = MainWindow(StudioSettings())
    window.show()
    window.load_model(ModelChoice(spec=model_dir, kv_memory_mib=16))
    chat = window.tabs.current
    chat.set_settings(ChatSettings(temperature=0.0, max_tokens=max_tokens))
    chat.send("tell me a long story")  # waits for the model, then streams
    print(f"sent in chat {chat.chat_id}", flush=True)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
