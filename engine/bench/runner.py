"""Runs the chosen workloads through the engine, on the paths users take, and through the baselines, one system
after another in interleaved rounds."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx
import torch

from engine.bench import baselines
from engine.bench.engine_run import VIAS, run_engine
from engine.bench.http_client import llama_cpp_fields, run_through_server, served_model, studio_fields
from engine.bench.report import ratios, with_paired_ratios
from engine.bench.results import SystemResult
from engine.bench.servers import llama_cpp_available, llama_cpp_server, studio_server
from engine.bench.workloads import DEFAULT_BASELINES, WORKLOADS, Workload, build
from engine.core.config import DEFAULT_KV_MEMORY, EngineConfig, step_tokens_for
from engine.core.engine import Engine
from engine.model.llama_family import transformers_model
from engine.remote.metrics import parse_metrics
from engine.types import SamplingParams

BENCH_QUEUE_WAIT_S = 3600.0
Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchPlan:
    """How the engine is driven (`vias`, the first one is the reference of the ratios) and what the servers need:
    the command that runs this installation's `inference-studio serve` with the model and engine options, the
    GGUF file llama.cpp's server reads (None: not a GGUF model), the threads every system gets. `paths` adds ways
    to drive the engine that live outside it (the window, which needs Qt): via name -> run(loaded, workload,
    config, name) returning a SystemResult."""

    vias: tuple[str, ...] = ("thread",)
    serve_command: list[str] = field(default_factory=list)
    gguf: str | None = None
    threads: int = 2
    paths: Mapping[str, Callable[..., SystemResult]] = field(default_factory=dict)


# the baselines that run transformers' own forward in this process
TRANSFORMERS_BASELINES = ("sequential", "static", "generate-batch")


def _warm_up(loaded, transformers_baselines: bool) -> None:
    """First calls pay for lazy initialisation (thread pools, kernels); keep that out of every system.
    transformers_baselines: whether transformers' forward runs too (building its classes around a model of the
    engine's own modules imports its modeling code, which an engine-only run should not hold)."""
    engine = Engine(loaded, EngineConfig(kv_pages=8))
    engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished:
        engine.step()
    if not transformers_baselines:
        return
    model = transformers_model(loaded.model)
    with baselines.standard_attention(model):
        baselines.generate_padded(model, 0, [[1, 2, 3, 4]], 2)


def replies(result: SystemResult, tokenizer) -> list[str]:
    """The system's replies as text (servers stream text; in-process systems give token ids)."""
    if result.texts:
        return result.texts
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in result.outputs]


def _agreement(reference: SystemResult, other: SystemResult, tokenizer) -> float | None:
    """Share of requests whose greedy reply is the same (token ids where both have them, else text)."""
    if reference.outputs and other.outputs:
        mine, theirs = reference.outputs, other.outputs
    else:
        mine, theirs = replies(reference, tokenizer), replies(other, tokenizer)
    if not mine or len(mine) != len(theirs):
        return None
    return sum(1 for a, b in zip(mine, theirs, strict=True) if a == b) / len(mine)


def server_options(config: EngineConfig) -> list[str]:
    options = ["--page-size", str(config.page_size), "--max-running", str(config.max_running)]
    if config.kv_pages is not None:
        options += ["--kv-pages", str(config.kv_pages)]
    elif config.kv_memory_bytes is not None:  # else the server works out its automatic budget, as the engine does
        options += ["--kv-memory", str(config.kv_memory_bytes / 1024**2)]
    if config.max_step_tokens is not None:
        options += ["--max-step-tokens", str(config.max_step_tokens)]
    if not config.prefix_caching:
        options.append("--no-prefix-cache")
    options += ["--prefill-budget-ms", str((config.prefill_budget_s or 0) * 1e3), "--draft-max", str(config.draft_max)]
    if not config.speculative:
        options.append("--no-speculative")
    # a workload's requests all wait their turn, however long a big model on a busy machine takes: the default's
    # 429 after 120 s in the queue protects interactive clients, and failed a 3B chat16 run on a loaded machine
    options += ["--max-queue-wait", str(int(BENCH_QUEUE_WAIT_S))]
    return options


def _run_studio_server(plan: BenchPlan, config: EngineConfig, workload: Workload) -> SystemResult:
    with studio_server(plan.serve_command, server_options(config), plan.threads) as server:
        result = run_through_server("engine-server", server.url, "bench", workload, studio_fields)
        result.extra.update(speculation_counts(server.url))
    result.extra["via"] = "server"
    return result


def speculation_counts(url: str) -> dict:
    """The server's speculative-decoding counters, read from its /metrics as the Remote endpoint panel reads them."""
    snapshot = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)
    drafted, accepted = snapshot.speculative_drafted_total, snapshot.speculative_accepted_total
    return {"draft_tokens": int(drafted or 0), "accepted_draft_tokens": int(accepted or 0)}


def _run_llama_cpp_server(plan: BenchPlan, workload: Workload) -> SystemResult:
    slots = len(workload.requests)
    ctx = min(131072, sum(len(r.prompt_ids) + r.max_new_tokens for r in workload.requests) + 256)
    with llama_cpp_server(plan.gguf or "", plan.threads, slots, ctx) as server:
        result = run_through_server(
            "llama-cpp-server", server.url, served_model(server.url), workload, llama_cpp_fields
        )
    result.extra["flags"] = server.details
    return result


def _engine_systems(loaded, workload: Workload, config: EngineConfig, plan: BenchPlan) -> list:
    systems = []
    for via in plan.vias:
        if via == "server":
            systems.append(("engine through its server", functools.partial(_run_studio_server, plan, config, workload)))
        elif via in plan.paths:
            run = functools.partial(plan.paths[via], loaded, workload, config, name=f"engine-{via}")
            systems.append((f"engine through the {via}", run))
        else:
            run = functools.partial(run_engine, loaded, workload, config, name=f"engine-{via}", via=via)
            systems.append((f"engine ({via} thread)" if via == "main" else "engine (its thread)", run))
    if workload.name == "shared-prefix":
        off = dataclasses.replace(config, prefix_caching=False)
        via = next((v for v in plan.vias if v in ("thread", "main")), "thread")
        run = functools.partial(run_engine, loaded, workload, off, name="engine-no-prefix-cache", via=via)
        systems.append(("engine without prefix caching", run))
    return systems


def _systems(loaded, workload: Workload, chosen: list[str], config: EngineConfig, plan: BenchPlan) -> list:
    """Every system of this workload as (progress label, run): the engine's paths first, then the baselines."""
    systems = _engine_systems(loaded, workload, config, plan)
    runners = {
        "sequential": baselines.run_sequential,
        "static": baselines.run_static,
        "generate-batch": baselines.run_generate_batch,
    }
    for name in chosen:
        if name == "llama-cpp-server":
            why = llama_cpp_available() or (None if plan.gguf else "the model is not a GGUF file")
            if why:
                skipped = SystemResult(name, 0, [], skipped=why)
                systems.append((name, lambda skipped=skipped: skipped))
            else:
                systems.append((name, functools.partial(_run_llama_cpp_server, plan, workload)))
            continue
        run = runners[name]
        if name == "generate-batch":
            kv_bytes = config.kv_memory_bytes if config.kv_pages is None else None
            run = functools.partial(run, kv_memory_bytes=kv_bytes or DEFAULT_KV_MEMORY)
        systems.append((name, functools.partial(_run_baseline, name, run, loaded, workload)))
    return systems


def _run_baseline(name: str, run, loaded, workload: Workload) -> SystemResult:
    try:
        return run(transformers_model(loaded.model), loaded.tokenizer, workload, time.perf_counter())
    except Exception as exc:  # a baseline that breaks must not take the engine's numbers with it
        return SystemResult(name, 0, [], skipped=f"{type(exc).__name__}: {exc}")


def _median_run(runs: list[SystemResult]) -> SystemResult:
    """The run with the median throughput: a real run, so its latencies and counters belong together."""
    if len(runs) == 1 or runs[0].skipped:
        return runs[0]
    ordered = sorted(runs, key=lambda r: r.summary()["tokens_per_s"] or 0.0)
    return ordered[(len(ordered) - 1) // 2]


def run_workload(
    loaded, workload: Workload, chosen: list[str], config: EngineConfig, progress: Progress, plan: BenchPlan,
    repeat: int = 1,
) -> dict:  # fmt: skip
    """Runs every system `repeat` times in interleaved rounds (engine, baselines, engine, baselines, ...), so a
    slow spell of a shared machine hits all of them alike, and keeps each system's median run."""
    systems = _systems(loaded, workload, chosen, config, plan)
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
    reference = results[0]
    return with_paired_ratios(
        {
            "description": workload.description,
            "requests": len(workload.requests),
            "output_tokens": workload.output_tokens,
            "prompt_tokens": sum(len(r.prompt_ids) for r in workload.requests),
            "systems": rows,
            "repeat": repeat,
            "tokens_per_s_runs": {
                r.system: [x.summary().get("tokens_per_s") for x in rs] for r, rs in zip(results, runs, strict=True)
            },
            "ratios": ratios(rows, reference.system),
            "same_tokens_as": {
                r.system: _agreement(reference, r, loaded.tokenizer) for r in results[1:] if not r.skipped
            },
        },
        reference.system,
    )


def run_benchmark(
    loaded,
    workloads: list[str] | None = None,
    chosen_baselines: list[str] | None = None,
    config: EngineConfig | None = None,
    progress: Progress = lambda message: None,
    scale: float = 1.0,
    plan: BenchPlan | None = None,
    repeat: int = 1,
) -> dict:
    if repeat < 1:
        raise ValueError("--repeat must be at least 1")
    plan = plan or BenchPlan()
    unknown = [v for v in plan.vias if v not in VIAS and v not in plan.paths]
    if unknown or not plan.vias:
        raise ValueError(f"--via takes {', '.join(VIAS)}, not {', '.join(unknown) or 'nothing'}")
    config = config or EngineConfig()
    if config.max_step_tokens is None:  # the record shows the budget the engine really used
        config = dataclasses.replace(config, max_step_tokens=step_tokens_for(str(loaded.options.device)))
    names = workloads or WORKLOADS
    chosen_by_workload = {n: DEFAULT_BASELINES[n] if chosen_baselines is None else chosen_baselines for n in names}
    progress("warming up")
    _warm_up(loaded, any(b in TRANSFORMERS_BASELINES for chosen in chosen_by_workload.values() for b in chosen))
    record = {
        "model": loaded.info.description,
        "dtype": loaded.info.dtype,
        "device": loaded.info.device,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "engine_config": dataclasses.asdict(config),
        "via": list(plan.vias),
        "eos": "banned until max tokens in every system (min_tokens, min_new_tokens, llama.cpp's ignore_eos), "
        "except generate-batch, which keeps generating past a sampled EOS",
        "workloads": {},
    }
    for name in names:
        workload = build(name, loaded.tokenizer, scale)
        record["workloads"][name] = run_workload(
            loaded, workload, chosen_by_workload[name], config, progress, plan, repeat
        )
    return record
