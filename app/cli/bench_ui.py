"""`inference-studio bench-ui`: UI event-loop stall and engine throughput, dashboard visible vs hidden, 8 chats."""

from __future__ import annotations

import argparse
import os

from app.cli.options import add_engine_options, add_model_options


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    add_engine_options(parser)
    parser.add_argument("--chats", type=int, default=8, help="chats streaming at once (default 8)")
    parser.add_argument("--phases", type=int, default=24, help="alternating phases, dashboard shown/hidden (24)")
    parser.add_argument("--phase-seconds", type=float, default=3.0, help="length of one phase (default 3 s)")
    parser.add_argument("--screenshot", metavar="PNG", help="save the window while the chats stream")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="plain text views instead of the studio's window and chat tabs (isolates the dashboard's own cost)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    # Qt loads only when this command runs: the terminal commands work on machines without Qt's libraries
    from app.bench.ui_run import run_bench

    return run_bench(args)
