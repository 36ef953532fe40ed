"""`inference-studio bench --via server` with no in-process baseline: the studio's server and llama.cpp's, each
started cold on the same model file and measured from process start to first answer, then the workloads."""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch

from engine.bench.http_client import llama_cpp_fields, studio_fields
from engine.bench.model_file import (
    bench_tokenizer,
    equal_kv_context,
    gguf_path,
    gguf_types,
    model_bytes,
    read_through,
)
from engine.bench.process_watch import GIB, physical_memory
from engine.bench.results import SystemResult
from engine.bench.runner import server_options
from engine.bench.served import ServedPlan, ServedSystem, run_served
from engine.bench.servers import llama_cpp_available, llama_cpp_server, studio_server
from engine.bench.workloads import build
from engine.core.config import EngineConfig
from engine.errors import InvalidRequestError
from engine.paths import cache_dir

SERVER_SYSTEMS = {"llama-cpp-server"}
DEFAULT_CAP_SHARE = 0.9  # of physical memory: past it the machine's OOM killer would pick a victim


def is_served(vias: tuple[str, ...], chosen: list[str] | None) -> bool:
    """Only servers to run: nothing needs the model in the bench's own process."""
    return vias == ("server",) and (chosen is None or set(chosen) <= SERVER_SYSTEMS)


def memory_cap_bytes(cap_gib: float | None) -> int | None:
    if cap_gib is None:
        return int(physical_memory() * DEFAULT_CAP_SHARE) or None
    if cap_gib < 0:
        raise InvalidRequestError(f"--memory-cap-gib must be 0 (no cap) or more, not {cap_gib:g}")
    return int(cap_gib * GIB) or None


def run_served_bench(
    args: argparse.Namespace,
    config: EngineConfig,
    workload_names: list[str],
    chosen: list[str] | None,
    gguf: str | None,
    serve_command: list[str],
    progress,
) -> dict:
    if args.start_timeout <= 0:
        raise InvalidRequestError(f"--start-timeout must be positive, not {args.start_timeout:g}")
    cap = memory_cap_bytes(args.memory_cap_gib)
    threads = args.threads or torch.get_num_threads()
    gguf_file = gguf or (str(gguf_path(args.model)) if gguf_path(args.model) else None)
    progress("reading the tokenizer")
    tokenizer = bench_tokenizer(args.model)
    workloads = [build(name, tokenizer, args.scale) for name in workload_names]
    limits = {"ready_timeout_s": args.start_timeout, "memory_cap_bytes": cap}
    options = server_options(config)
    systems = [
        ServedSystem(
            "engine-server", functools.partial(studio_server, serve_command, options, threads, **limits), studio_fields,
            model_id="bench",
        )
    ]  # fmt: skip
    record: dict = {
        "mode": "servers",
        "model": args.model,
        "model_bytes": model_bytes(args.model),
        "gguf_types": gguf_types(Path(gguf_file)) if gguf_file else None,
        "threads": threads,
        "memory_cap_bytes": cap,
        "start_timeout_s": args.start_timeout,
        "kv_memory_bytes": config.kv_memory_bytes if config.kv_pages is None else None,
        "engine_options": options,
        "torch": torch.__version__,
    }
    skipped = {}
    if chosen is None or "llama-cpp-server" in chosen:
        why = llama_cpp_available() or (None if gguf_file else "the model is not a GGUF file")
        if why:
            skipped["llama-cpp-server"] = why
        else:
            assert gguf_file is not None
            needed = max(sum(len(r.prompt_ids) + r.max_new_tokens for r in w.requests) for w in workloads) + 256
            ctx, kv_bytes = equal_kv_context(Path(gguf_file), config.kv_memory_bytes, needed)
            slots = max(len(w.requests) for w in workloads)
            record["llama_cpp"] = {"ctx": ctx, "kv_bytes_f16": kv_bytes, "slots": slots, "file": gguf_file}
            server = functools.partial(llama_cpp_server, gguf_file, threads, slots, ctx, **limits)
            systems.append(ServedSystem("llama-cpp-server", server, llama_cpp_fields))
    progress("reading the model's files once (both servers then start from the page cache)")
    record["page_cache_warmed_bytes"] = read_through(gguf_file or args.model)
    plan = ServedPlan(systems, record["model_bytes"], cache_dir(), args.repeat)
    record.update(run_served(tokenizer, workloads, plan, progress))
    for name, why in skipped.items():
        for result in record["workloads"].values():
            result["systems"].append(SystemResult(name, 0, [], skipped=why).summary())
    return record
