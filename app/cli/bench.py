"""`inference-studio bench`: the engine against transformers baselines, side by side in one run."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

import torch

from app.bench.plot import plot
from app.cli.options import add_engine_options, add_model_options, engine_config_from, load_options_from
from engine.bench import report
from engine.bench.engine_run import VIAS
from engine.bench.gguf_mix import MIXES
from engine.bench.memory import MemoryProbe
from engine.bench.synthetic import SHAPES, synthetic_gguf, synthetic_model
from engine.bench.workloads import BASELINES, WORKLOADS
from engine.core.config import EngineConfig
from engine.errors import InvalidRequestError


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    add_engine_options(parser)
    parser.add_argument(
        "--workload",
        action="append",
        metavar="NAME",
        help=f"one of {', '.join(WORKLOADS)} (repeatable; default: all)",
    )
    parser.add_argument(
        "--baselines",
        default=None,
        metavar="LIST",
        help=f"comma-separated from {', '.join(BASELINES)}, 'all' or 'none' (default: per workload)",
    )
    parser.add_argument(
        "--via",
        default="thread",
        metavar="LIST",
        help=f"how the engine is driven, comma-separated from {', '.join(PATHS)} (default thread, as `generate` runs "
        "it; server: `inference-studio serve` and a streaming client; window: the studio's main window, offscreen, "
        "one chat tab per request); the first is the reference of the ratios. `--via server` with no in-process "
        "baseline (then llama.cpp's server is the default one) loads nothing in the bench itself: every server starts "
        "cold and its start is measured (time to first answer, memory, disk)",
    )
    parser.add_argument(
        "--synthetic",
        choices=sorted(SHAPES),
        default=None,
        help="a random-weight model with a real model's shape, written once under the user cache (instead of "
        "--model): how cost grows with the model",
    )
    parser.add_argument(
        "--synthetic-format",
        choices=SYNTHETIC_FORMATS,
        default="q4_k_m",
        help="q4_k_m (default): one GGUF file in llama.cpp's Q4_K_M mix that every system reads; q4_1: the same, all "
        "Q4_1; folder: a bfloat16 Hugging Face folder for the studio and transformers, its weights as Q4_1 GGUF for "
        "llama.cpp",
    )
    parser.add_argument(
        "--memory-cap-gib",
        type=float,
        default=None,
        metavar="GIB",
        help="servers: stop one whose resident memory passes GIB and report its peak (default: 90 %% of this "
        "machine's memory, so the system's OOM killer never picks; 0: no cap)",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="servers: seconds a server may take to become ready before its row says it did not (default 1800)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads for every system")
    parser.add_argument("--scale", type=float, default=1.0, help="shrink token counts (quick checks)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run every system N times in interleaved rounds and report each one's median run (noisy machines)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write every figure to FILE")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="draw the comparison into FILE.png")
    parser.set_defaults(handler=run)


PATHS = (*VIAS, "window")
SYNTHETIC_FORMATS = (*MIXES, "folder")


def _window_path():
    """The window path needs Qt: imported only when asked for, so `bench` runs on machines without Qt's libraries."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from app.bench.window_path import run_window

    return run_window


def _parse_baselines(text: str | None) -> list[str] | None:
    if text is None:
        return None
    if text == "all":
        return list(BASELINES)
    if text == "none":
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise InvalidRequestError(f"unknown baseline {unknown[0]!r}; choose from {', '.join(BASELINES)}")
    return names


def _model_arguments(args: argparse.Namespace) -> list[str]:
    """The model options, for the `serve` process the server path starts (engine options come from the config)."""
    model = ["--model", args.model] if args.model else []
    return [*model, "--dtype", args.dtype, "--quant", args.quantization, "--device", args.device]


def _progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _checked_choices(args: argparse.Namespace) -> tuple[list[str], list[str] | None, EngineConfig, tuple[str, ...]]:
    """The workloads, baselines, engine settings and paths asked for, each checked: one clear line if not."""
    workloads = args.workload or WORKLOADS
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise InvalidRequestError(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
    chosen = _parse_baselines(args.baselines)
    config = engine_config_from(args)
    config.validate()
    if args.repeat < 1:
        raise InvalidRequestError("--repeat must be at least 1")
    vias = tuple(v.strip() for v in args.via.split(",") if v.strip())
    unknown = [v for v in vias if v not in PATHS]
    if unknown or not vias:
        raise InvalidRequestError(f"unknown --via {', '.join(unknown) or '(empty)'}; choose from {', '.join(PATHS)}")
    return workloads, chosen, config, vias


def _make_synthetic(args: argparse.Namespace) -> str | None:
    """With --synthetic, build the model (args.model points at it) and return its GGUF twin for llama.cpp."""
    if not args.synthetic:
        return None
    if args.model:
        raise InvalidRequestError("give --model or --synthetic, not both")
    if args.synthetic_format == "folder":
        synthetic = synthetic_model(args.synthetic, progress=_progress)
        args.model = str(synthetic.folder)
        return str(synthetic.gguf)
    args.model = str(synthetic_gguf(args.synthetic, args.synthetic_format, progress=_progress))
    return args.model


def run(args: argparse.Namespace) -> int:
    # here, not at the top: they import transformers' generation and the HTTP client, which every other
    # command (serve above all, where they cost ~1.5 s of its start) would pay for
    from app.cli.bench_served import is_served, run_served_bench

    workloads, chosen, config, vias = _checked_choices(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    gguf = _make_synthetic(args)
    command = "inference-studio bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    serve_command = [sys.executable, "-m", "app", "serve", *_model_arguments(args)]
    if is_served(vias, chosen):
        record = run_served_bench(args, config, workloads, chosen, gguf, serve_command, _progress)
        record["command"] = command
        print(f"model: {record['model']}, {record['threads']} threads per server")
        print("\n## start: from the process start to the first streamed token; memory and disk from /proc\n")
        print(report.start_table(record["starts"]))
        for line in report.start_ratio_lines(record["start_ratios"]):
            print(line)
    else:
        record = _run_in_process(args, workloads, chosen, config, vias, gguf, serve_command)
        record["command"] = command
        print(f"model: {record['model']}, torch threads {record['torch_threads']}")
        print(MemoryProbe.line(record["memory"]))
    _print_workloads(record)
    if args.json:
        report.write_json(args.json, record)
        print(f"\nwrote {args.json}")
    if args.plot:
        plot(args.plot, record)
        print(f"wrote {args.plot}")
    json.dumps(record, default=str)  # fail here, not in a later reader, if something isn't serialisable
    return 0


def _run_in_process(
    args: argparse.Namespace,
    workloads: list[str],
    chosen: list[str] | None,
    config: EngineConfig,
    vias: tuple[str, ...],
    gguf: str | None,
    serve_command: list[str],
) -> dict:
    """The engine loaded in this process (the engine-thread, window and served paths measured from here)."""
    from engine.bench.runner import BenchPlan, run_benchmark
    from engine.load.loader import load_model

    memory = MemoryProbe()
    loaded = load_model(args.model, load_options_from(args))
    memory.loaded(loaded)
    plan = BenchPlan(
        vias=vias,
        serve_command=serve_command,
        gguf=gguf or (str(loaded.source.path) if loaded.source.is_gguf else None),
        threads=torch.get_num_threads(),
        paths={"window": _window_path()} if "window" in vias else {},
    )
    record = run_benchmark(
        loaded, workloads, chosen, config, _progress, scale=args.scale, plan=plan, repeat=args.repeat
    )
    record["memory"] = memory.report(loaded, config)
    return record


def _print_workloads(record: dict) -> None:
    for name, result in record["workloads"].items():
        print(f"\n## {name}: {result['description']}\n")
        print(report.table(result["systems"]))
        if result["repeat"] > 1:
            runs = "; ".join(
                f"{system} " + ", ".join(f"{x:.1f}" for x in values if x is not None)
                for system, values in result["tokens_per_s_runs"].items()
                if values
            )
            print(f"\nmedian of {result['repeat']} interleaved runs; tok/s of each run: {runs}")
        for row in result["systems"]:
            figures = row.get("steps") or row.get("draft_tokens")  # the server's own: its speculation counters
            if row["system"].startswith("engine") and not row.get("skipped") and figures:
                print("\n" + report.engine_details(row))
        for system, entry in result["ratios"].items():
            parts = ", ".join(f"{k} {v:.2f}" for k, v in entry.items())
            print(f"{result['systems'][0]['system']} vs {system}: {parts}")
        if result["same_tokens_as"]:
            same = ", ".join(f"{k} {v:.0%}" for k, v in result["same_tokens_as"].items() if v is not None)
            print(f"requests with identical greedy tokens: {same}")
