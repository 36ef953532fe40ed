"""`inference-studio bench`: the engine against transformers baselines, side by side in one run."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

from app.bench.plot import plot
from app.cli.options import add_engine_options, add_model_options, engine_config_from, load_options_from
from engine.bench import report
from engine.bench.runner import BASELINES, run_benchmark
from engine.bench.workloads import WORKLOADS
from engine.errors import InvalidRequestError
from engine.load.loader import load_model


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


def run(args: argparse.Namespace) -> int:
    workloads = args.workload or WORKLOADS
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise InvalidRequestError(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
    chosen = _parse_baselines(args.baselines)
    config = engine_config_from(args)
    config.validate()
    if args.repeat < 1:
        raise InvalidRequestError("--repeat must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)

    def progress(message: str) -> None:
        print(f"[bench] {message}", file=sys.stderr, flush=True)

    loaded = load_model(args.model, load_options_from(args))
    gguf = str(loaded.source.path) if loaded.source.is_gguf else None
    record = run_benchmark(
        loaded, workloads, chosen, config, progress, scale=args.scale, llama_cpp_gguf=gguf, repeat=args.repeat
    )
    record["command"] = "inference-studio bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    print(f"model: {record['model']}, torch threads {record['torch_threads']}")
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
            if row["system"].startswith("engine") and not row.get("skipped"):
                print("\n" + report.engine_details(row))
        for system, entry in result["ratios"].items():
            parts = ", ".join(f"{k} {v:.2f}" for k, v in entry.items())
            print(f"engine vs {system}: {parts}")
        if result["same_tokens_as"]:
            same = ", ".join(f"{k} {v:.0%}" for k, v in result["same_tokens_as"].items() if v is not None)
            print(f"requests with identical greedy tokens: {same}")
    if args.json:
        report.write_json(args.json, record)
        print(f"\nwrote {args.json}")
    if args.plot:
        plot(args.plot, record)
        print(f"wrote {args.plot}")
    json.dumps(record, default=str)  # fail here, not in a later reader, if something isn't serialisable
    return 0
