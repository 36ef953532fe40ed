"""Runs the chosen workloads through the engine and the baselines, one after another in one process."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import time
from collections.abc import Callable

import torch

from engine.bench import baselines
from engine.bench.engine_run import run_engine
from engine.bench.report import ratios
from engine.bench.results import SystemResult
from engine.bench.workloads import WORKLOADS, Workload, build
from engine.core.config import DEFAULT_KV_MEMORY, EngineConfig, step_tokens_for
from engine.core.engine import Engine
from engine.types import SamplingParams

BASELINES = ("sequential", "static", "generate-batch", "llama-cpp")
# Defaults keep one `bench` run to a few minutes on a 2-core CPU: the one-at-a-time baseline only where
# it finishes in reasonable time; `--baselines all` runs everything everywhere.
DEFAULT_BASELINES = {
    "single": ["sequential", "static", "generate-batch"],
    "chat16": ["sequential", "static", "generate-batch"],
    "chat64": ["static"],
    "shared-prefix": ["static"],
    "arrivals": ["static", "generate-batch"],
}

Progress = Callable[[str], None]


def _warm_up(loaded) -> None:
    """First calls pay for lazy initialisation (thread pools, kernels); keep that out of every system."""

    engine = Engine(loaded, EngineConfig(kv_pages=8))
    engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished:
        engine.step()
    with baselines.standard_attention(loaded.model):
        baselines.generate_padded(loaded.model, 0, [[1, 2, 3, 4]], 2)


def _agreement(engine: SystemResult, other: SystemResult) -> float | None:
    if not engine.outputs or not other.outputs or len(engine.outputs) != len(other.outputs):
        return None
    same = sum(1 for a, b in zip(engine.outputs, other.outputs, strict=True) if a == b)
    return same / len(engine.outputs)


def _systems(
    loaded, workload: Workload, chosen: list[str], config: EngineConfig, llama_cpp_gguf: str | None
) -> list[tuple[str, Callable[[], SystemResult]]]:
    """Every system of this workload as (progress label, run): the engine first, then the chosen baselines."""
    systems: list[tuple[str, Callable[[], SystemResult]]] = [("engine", lambda: run_engine(loaded, workload, config))]
    if workload.name == "shared-prefix":
        off = dataclasses.replace(config, prefix_caching=False)
        systems.append(
            ("engine without prefix caching", lambda: run_engine(loaded, workload, off, name="engine-no-prefix-cache"))
        )
    runners = {
        "sequential": baselines.run_sequential,
        "static": baselines.run_static,
        "generate-batch": baselines.run_generate_batch,
    }
    for name in chosen:
        if name == "llama-cpp":
            if importlib.util.find_spec("llama_cpp") is None or not llama_cpp_gguf:
                skipped = SystemResult("llama-cpp-python", 0, [], skipped="llama-cpp-python not installed")
                systems.append((name, lambda skipped=skipped: skipped))
                continue
            systems.append((name, functools.partial(_run_llama_cpp, llama_cpp_gguf, loaded, workload)))
            continue
        run = runners[name]
        if name == "generate-batch":
            kv_bytes = config.kv_memory_bytes if config.kv_pages is None else None
            run = functools.partial(run, kv_memory_bytes=kv_bytes or DEFAULT_KV_MEMORY)
        systems.append((name, functools.partial(_run_baseline, name, run, loaded, workload)))
    return systems


def _run_llama_cpp(gguf: str, loaded, workload: Workload) -> SystemResult:
    return baselines.run_llama_cpp(gguf, loaded.tokenizer, workload, time.perf_counter(), torch.get_num_threads())


def _run_baseline(name: str, run, loaded, workload: Workload) -> SystemResult:
    try:
        return run(loaded.model, loaded.tokenizer, workload, time.perf_counter())
    except Exception as exc:  # a baseline that breaks must not take the engine's numbers with it
        return SystemResult(name, 0, [], skipped=f"{type(exc).__name__}: {exc}")


def _median_run(runs: list[SystemResult]) -> SystemResult:
    """The run with the median throughput: a real run, so its latencies and counters belong together."""
    if len(runs) == 1 or runs[0].skipped:
        return runs[0]
    ordered = sorted(runs, key=lambda r: r.summary()["tokens_per_s"] or 0.0)
    return ordered[(len(ordered) - 1) // 2]


def run_workload(
    loaded,
    workload: Workload,
    chosen: list[str],
    config: EngineConfig,
    progress: Progress,
    llama_cpp_gguf: str | None = None,
    repeat: int = 1,
) -> dict:
    """Runs every system `repeat` times in interleaved rounds (engine, baselines, engine, baselines, ...), so a
    slow spell of a shared machine hits all of them alike, and keeps each system's median run."""
    systems = _systems(loaded, workload, chosen, config, llama_cpp_gguf)
    runs: list[list[SystemResult]] = [[] for _ in systems]
    for round_index in range(repeat):
        suffix = f" (round {round_index + 1} of {repeat})" if repeat > 1 else ""
        for index, (label, run) in enumerate(systems):
            if runs[index] and runs[index][0].skipped:
                continue
            progress(f"{workload.name}: {label}{suffix}")
            runs[index].append(run())
    results = [_median_run(r) for r in runs]
    rows = [r.summary() for r in results]
    engine_result = results[0]
    return {
        "description": workload.description,
        "requests": len(workload.requests),
        "output_tokens": workload.output_tokens,
        "prompt_tokens": sum(len(r.prompt_ids) for r in workload.requests),
        "systems": rows,
        "repeat": repeat,
        "tokens_per_s_runs": {
            r.system: [x.summary()["tokens_per_s"] for x in rs] for r, rs in zip(results, runs, strict=True)
        },
        "ratios": ratios(rows),
        "same_tokens_as": {r.system: _agreement(engine_result, r) for r in results[1:] if not r.skipped and r.outputs},
    }


def run_benchmark(
    loaded,
    workloads: list[str] | None = None,
    chosen_baselines: list[str] | None = None,
    config: EngineConfig | None = None,
    progress: Progress = lambda message: None,
    scale: float = 1.0,
    llama_cpp_gguf: str | None = None,
    repeat: int = 1,
) -> dict:
    if repeat < 1:
        raise ValueError("--repeat must be at least 1")
    config = config or EngineConfig()
    if config.max_step_tokens is None:  # the record shows the budget the engine really used
        config = dataclasses.replace(config, max_step_tokens=step_tokens_for(str(loaded.options.device)))
    names = workloads or WORKLOADS
    progress("warming up")
    _warm_up(loaded)
    record = {
        "model": loaded.info.description,
        "dtype": loaded.info.dtype,
        "device": loaded.info.device,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "engine_config": dataclasses.asdict(config),
        "workloads": {},
    }
    for name in names:
        workload = build(name, loaded.tokenizer, scale)
        chosen = DEFAULT_BASELINES[name] if chosen_baselines is None else chosen_baselines
        record["workloads"][name] = run_workload(loaded, workload, chosen, config, progress, llama_cpp_gguf, repeat)
    return record
