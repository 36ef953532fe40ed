"""The model and engine options every command shares, and the EngineOptions they make."""

from __future__ import annotations

import argparse

from engine.core.config import EngineConfig
from engine.launch import EngineOptions
from engine.load import kv_policy
from engine.load.load_options import DEVICES, DTYPES, QUANTIZATIONS, LoadOptions

MIB = 1024**2


def add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", default=None, help="embedded default, HF folder, .gguf file or hub repo id")
    # validated by the loader rather than argparse, so a wrong value gets one clear line, not a usage dump
    group.add_argument("--dtype", default="auto", help=f"one of {', '.join(DTYPES)}")
    group.add_argument(
        "--quant",
        dest="quantization",  # LoadOptions' name for it, wherever the choice goes
        default="none",
        help=f"weight quantization: {', '.join(QUANTIZATIONS)} (int8/int4 on a CPU: the engine's kernels, used for the "
        "batch sizes where they are measured faster; nf4/fp4: bitsandbytes)",
    )
    group.add_argument("--device", default="auto", help=f"one of {', '.join(DEVICES)}")


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    defaults = EngineConfig()
    group = parser.add_argument_group("engine")
    group.add_argument(
        "--page-size", type=int, default=defaults.page_size, help=f"tokens per KV page (default {defaults.page_size})"
    )
    group.add_argument("--kv-pages", type=int, default=None, help="number of KV pages (default: from --kv-memory)")
    group.add_argument(
        "--kv-memory",
        type=float,
        default=None,
        help=f"KV cache budget in MiB (default: {kv_policy.DEFAULT_TOKENS:,} tokens of the model's KV, at most half "
        "the memory free beside the model)",
    )
    group.add_argument(
        "--max-running", type=int, default=defaults.max_running, help="most sequences decoded in one step"
    )
    group.add_argument(
        "--max-step-tokens", type=int, default=None, help="token budget of one step (default: 256 on CPU, 2048 on GPU)"
    )
    group.add_argument("--no-prefix-cache", action="store_true", help="turn prefix caching off")
    group.add_argument(
        "--prefill-budget-ms",
        type=float,
        default=defaults.prefill_budget_s * 1e3 if defaults.prefill_budget_s else 0,
        help="time a step may spend prefilling while other replies stream (0: the token budget alone)",
    )
    group.add_argument(
        "--no-speculative", action="store_true", help="turn speculative decoding (prompt-lookup drafts) off"
    )
    group.add_argument(
        "--no-compiled-step",
        action="store_true",
        help="run every step through the Python layers (default: decode steps run as one C++ call, compiled for "
        "this CPU on the first start where a C++ compiler is found)",
    )
    group.add_argument(
        "--draft-max", type=int, default=defaults.draft_max, help=f"longest draft (default {defaults.draft_max})"
    )


def load_options_from(args: argparse.Namespace) -> LoadOptions:
    return LoadOptions(dtype=args.dtype, quantization=args.quantization, device=args.device)


def engine_config_from(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        page_size=args.page_size,
        kv_pages=args.kv_pages,
        kv_memory_bytes=None if args.kv_memory is None else int(args.kv_memory * MIB),
        max_running=args.max_running,
        max_step_tokens=args.max_step_tokens,
        prefix_caching=not args.no_prefix_cache,
        prefill_budget_s=args.prefill_budget_ms / 1e3 if args.prefill_budget_ms > 0 else None,
        speculative=not args.no_speculative,
        draft_max=args.draft_max,
        compiled_step=not args.no_compiled_step,
    )


def engine_options_from(args: argparse.Namespace) -> EngineOptions:
    """Every command with model and engine options starts its engine from these."""
    return EngineOptions(args.model, load_options_from(args), engine_config_from(args))
