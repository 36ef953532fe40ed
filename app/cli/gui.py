"""Starts the desktop window, or says why it can't (no display, missing Qt platform libraries) and what to do."""

from __future__ import annotations

import argparse
import os
import sys

from app.cli.options import add_model_options
from app.cli.qt_libraries import missing_libraries, missing_libraries_message, uses_xcb


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("--self-test", action="store_true", help="open two chats offscreen, check replies, exit")
    parser.add_argument("--screenshot", metavar="DIR", help="with --self-test: save screenshots into DIR")
    parser.set_defaults(handler=launch)


def display_available() -> bool:
    if os.environ.get("QT_QPA_PLATFORM", "").startswith(("offscreen", "minimal", "vnc")):
        return True
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


def launch(args: argparse.Namespace) -> int:
    if getattr(args, "self_test", False):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    if not display_available():
        print(
            "inference-studio: no display found (DISPLAY/WAYLAND_DISPLAY unset); for the terminal use "
            "`inference-studio generate --prompt ...` or `inference-studio serve`",
            file=sys.stderr,
        )
        return 1
    if uses_xcb() and (missing := missing_libraries()):
        print(missing_libraries_message(missing), file=sys.stderr)
        return 1
    # Qt loads here, after the display check, so the terminal commands run on machines without Qt's libraries
    from app.window.main_window import run_studio

    return run_studio(args)
