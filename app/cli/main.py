"""The `inference-studio` command line: the window by default, plus generate, bench and serve."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from app.cli import bench as bench_command
from app.cli import bench_ui as bench_ui_command
from app.cli import generate as generate_command
from app.cli import gui as gui_command
from app.cli import serve as serve_command
from app.cli.log_setup import configure_logging
from app.version import __version__
from engine.errors import StudioError


def _quiet_libraries() -> None:
    """Progress bars and advice from transformers/hub are noise on a terminal that streams text. Said through their
    environment, not by importing transformers: its import (half a second) then happens inside the load, where the
    weights convert on the other core meanwhile (engine/load/gguf_loader.py Prefetch)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' own bars follow the hub's at import
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    transformers = sys.modules.get("transformers")
    if transformers is not None:  # imported already (an embedding program): its settings are read, so set them
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inference-studio",
        description="Run language models on your own workstation: a desktop studio, a batched engine, a server.",
    )
    parser.add_argument("--version", action="version", version=f"inference-studio {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the engine does")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gui_command.configure(sub.add_parser("gui", help="open the desktop studio (the default)"))

    generate = sub.add_parser("generate", help="run prompts through the engine, batched, and print the replies")
    generate_command.configure(generate)

    bench = sub.add_parser("bench", help="measure the engine against transformers baselines, side by side")
    bench_command.configure(bench)

    serve = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API, with /metrics")
    serve_command.configure(serve)

    bench_ui_parser = sub.add_parser("bench-ui", help="UI stall and engine throughput, dashboard shown vs hidden")
    bench_ui_command.configure(bench_ui_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("--") and argv[0] not in ("--version", "--help", "-h", "-v", "--verbose")):
        argv = ["gui", *argv]  # `inference-studio --self-test` means the window
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    _quiet_libraries()
    if args.command is None:
        args = parser.parse_args(["gui"])
    try:
        return args.handler(args)
    except StudioError as exc:
        print(f"inference-studio: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("inference-studio: interrupted", file=sys.stderr)
        return 130
