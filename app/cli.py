"""The `inference-studio` command line: the window by default, plus generate, bench and serve."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from app.version import __version__


def _quiet_libraries() -> None:
    """Progress bars and advice from transformers/hub are noise on a terminal that streams text."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:
        pass


def add_model_options(parser: argparse.ArgumentParser) -> None:
    from engine.options import DEVICES, DTYPES, QUANTIZATIONS

    group = parser.add_argument_group("model")
    group.add_argument("--model", default=None, help="embedded default, HF folder, .gguf file or hub repo id")
    # validated by the loader rather than argparse, so a wrong value gets one clear line, not a usage dump
    group.add_argument("--dtype", default="auto", help=f"one of {', '.join(DTYPES)}")
    group.add_argument("--quant", default="none", help=f"bitsandbytes weight quantization: {', '.join(QUANTIZATIONS)}")
    group.add_argument("--device", default="auto", help=f"one of {', '.join(DEVICES)}")


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    group.add_argument("--page-size", type=int, default=16, help="tokens per KV page (default 16)")
    group.add_argument("--kv-pages", type=int, default=None, help="number of KV pages (default: from --kv-memory)")
    group.add_argument("--kv-memory", type=float, default=512, help="KV cache budget in MiB (default 512)")
    group.add_argument("--max-running", type=int, default=64, help="most sequences decoded in one step")
    group.add_argument(
        "--max-step-tokens", type=int, default=None, help="token budget of one step (default: 256 on CPU, 2048 on GPU)"
    )
    group.add_argument("--no-prefix-cache", action="store_true", help="turn prefix caching off")


def engine_config_from(args: argparse.Namespace):
    from engine.config import EngineConfig

    return EngineConfig(
        page_size=args.page_size,
        kv_pages=args.kv_pages,
        kv_memory_bytes=int(args.kv_memory * 1024**2),
        max_running=args.max_running,
        max_step_tokens=args.max_step_tokens,
        prefix_caching=not args.no_prefix_cache,
    )


def load_options_from(args: argparse.Namespace):
    from engine.options import LoadOptions

    return LoadOptions(dtype=args.dtype, quantization=args.quant, device=args.device)


def build_parser() -> argparse.ArgumentParser:
    from app import bench_command, bench_ui, generate_command, serve_command

    parser = argparse.ArgumentParser(
        prog="inference-studio",
        description="Run language models on your own workstation: a desktop studio, a batched engine, a server.",
    )
    parser.add_argument("--version", action="version", version=f"inference-studio {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the engine does")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gui = sub.add_parser("gui", help="open the desktop studio (the default)")
    add_model_options(gui)
    gui.add_argument("--self-test", action="store_true", help="open two chats offscreen, check replies, exit")
    gui.add_argument("--screenshot", metavar="DIR", help="with --self-test: save screenshots into DIR")

    generate = sub.add_parser("generate", help="run prompts through the engine, batched, and print the replies")
    generate_command.configure(generate)

    bench = sub.add_parser("bench", help="measure the engine against transformers baselines, side by side")
    bench_command.configure(bench)

    serve = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API, with /metrics")
    serve_command.configure(serve)

    bench_ui_parser = sub.add_parser("bench-ui", help="UI stall and engine throughput, dashboard shown vs hidden")
    bench_ui.configure(bench_ui_parser)
    return parser


def _run_gui(args: argparse.Namespace) -> int:
    from app import gui_launcher

    return gui_launcher.launch(args)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("--") and argv[0] not in ("--version", "--help", "-h", "-v", "--verbose")):
        argv = ["gui", *argv]  # `inference-studio --self-test` means the window
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    _quiet_libraries()
    if args.command is None:
        args = parser.parse_args(["gui"])
    from engine.errors import StudioError

    try:
        if args.command == "gui":
            return _run_gui(args)
        return args.handler(args)
    except StudioError as exc:
        print(f"inference-studio: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("inference-studio: interrupted", file=sys.stderr)
        return 130
