"""Servers benchmarked as a user starts them: each system's server process started cold on the same model file,
timed from its start to the first streamed token of a first request, its resident memory and disk writes read
from /proc, then the workloads through it with the streaming client. A system that fails to start, is killed or
passes the memory cap gets a row saying so with its peak; the other systems' figures still count."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.bench.http_client import ExtraFields, run_through_server, served_model
from engine.bench.process_watch import ProcessSample
from engine.bench.report import ratios, with_paired_ratios
from engine.bench.results import SystemResult
from engine.bench.servers import ServerFailed, ServerProcess
from engine.bench.workloads import BenchRequest, Workload
from engine.core.prompts import encode_prompt

FIRST_PROMPT = "Hello! Who are you?"
FIRST_TOKENS = 8  # the first answer only has to start; its first token is the figure
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ServedSystem:
    name: str
    server: Callable[[], ServerProcess]  # a fresh process, not started yet
    fields: ExtraFields  # what its requests add (how it is told to ignore EOS)
    model_id: str | None = None  # None: the first id its /v1/models lists


@dataclass(frozen=True)
class ServedPlan:
    systems: list[ServedSystem]  # the first is the reference of the ratios
    model_bytes: int | None = None  # the model file's size, which disk writes are compared with
    cache: Path | None = None  # the studio's user cache: files a start leaves there count as written
    repeat: int = 1


def cache_files(root: Path | None) -> dict[str, int]:
    """Path -> size of every file under the cache (a handful: converted models, measured formats)."""
    if root is None or not root.is_dir():
        return {}
    sizes = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                sizes[path] = os.stat(path).st_size
    return sizes


def cache_growth(before: dict[str, int], after: dict[str, int]) -> int:
    """Bytes of the files that are new, or grew, since `before`."""
    return sum(max(0, size - before.get(path, 0)) for path, size in after.items())


def first_workload(tokenizer) -> Workload:
    prompt = encode_prompt(tokenizer, messages=[{"role": "user", "content": FIRST_PROMPT}])
    return Workload("first answer", "one short chat, the first request", [BenchRequest(prompt, FIRST_TOKENS)])


def _memory(prefix: str, sample: ProcessSample | None) -> dict:
    if sample is None:
        return {}
    return {
        f"resident_{prefix}_bytes": sample.rss,
        f"resident_{prefix}_anon_bytes": sample.rss_anon,
        f"resident_{prefix}_file_bytes": sample.rss_file,
    }


def _written(start: ProcessSample | None, end: ProcessSample | None) -> int | None:
    if start is None or end is None or start.write_bytes is None or end.write_bytes is None:
        return None
    return end.write_bytes - start.write_bytes


def _failed_runs(system: str, workloads: list[Workload], why: str) -> dict[str, SystemResult]:
    return {w.name: SystemResult(system, 0, [], failed=why) for w in workloads}


def start_and_run(
    system: ServedSystem, workloads: list[Workload], tokenizer, plan: ServedPlan, progress: Progress
) -> tuple[dict, dict[str, SystemResult]]:
    """One cold start of the system's server, its first answer, then every workload through it: the start's row
    (times from the process start, memory, disk) and each workload's result."""
    row: dict = {"system": system.name}
    cache_before = cache_files(plan.cache)
    server = system.server()
    server.name = system.name  # its rows and messages go by the system's name
    server.on_progress = lambda line: progress(f"{system.name}: {line}")
    progress(f"{system.name}: starting")
    try:
        server.__enter__()
    except ServerFailed as exc:
        progress(str(exc))
        row.update(failed=str(exc), peak_resident_bytes=exc.peak_rss, failed_after_s=exc.after_s)
        row["cache_new_start_bytes"] = cache_growth(cache_before, cache_files(plan.cache))
        return row, _failed_runs(system.name, workloads, "did not start (see the start table)")
    assert server.watch is not None
    results: dict[str, SystemResult] = {}
    try:
        at_ready = server.watch.sample()
        row["ready_s"] = server.ready_at - server.started_at
        row.update(_memory("ready", at_ready))
        model = system.model_id or served_model(server.url)
        progress(f"{system.name}: ready after {row['ready_s']:.1f} s; first answer")
        first = run_through_server(system.name, server.url, model, first_workload(tokenizer), system.fields)
        row["first_token_s"] = first.timings[0].token_times[0] - server.started_at
        after_first = server.watch.sample()
        start_sample = server.watch.last if after_first is None else after_first
        row["disk_written_start_bytes"] = start_sample.write_bytes if start_sample else None
        cache_started = cache_files(plan.cache)
        row["cache_new_start_bytes"] = cache_growth(cache_before, cache_started)
        for workload in workloads:
            progress(f"{system.name}: {workload.name}")
            try:
                results[workload.name] = run_through_server(system.name, server.url, model, workload, system.fields)
            except Exception as exc:  # a server that dies mid-run fails its rows, not the benchmark
                why = str(server.failure(f"{system.name} stopped serving")) if not server.running() else str(exc)
                results[workload.name] = SystemResult(system.name, 0, [], failed=why)
        end = server.watch.sample() or server.watch.last
        row.update(_memory("after_runs", end))
        row["peak_resident_bytes"] = server.watch.peak_rss
        row["disk_written_run_bytes"] = _written(start_sample, end)
        row["cache_new_run_bytes"] = cache_growth(cache_started, cache_files(plan.cache))
        if not server.running():
            row["failed"] = str(server.failure(f"{system.name} stopped serving"))
    except Exception as exc:  # the first answer failed: the server died, or answered with an error
        failure = server.failure(f"{system.name} failed") if not server.running() else None
        row.update(failed=str(failure or f"{type(exc).__name__}: {exc}"), peak_resident_bytes=server.watch.peak_rss)
        results = {**_failed_runs(system.name, workloads, row["failed"]), **results}
    finally:
        if row.get("failed"):
            progress(row["failed"])
        server.__exit__()
    return row, results


def _median(runs: list[SystemResult]) -> SystemResult:
    """The run with the median throughput among those that ran (a real run: its figures belong together)."""
    ran = [r for r in runs if not r.failed]
    if not ran:
        return runs[0]
    ordered = sorted(ran, key=lambda r: r.summary()["tokens_per_s"] or 0.0)
    return ordered[(len(ordered) - 1) // 2]


def start_ratios(rows: list[dict], reference: str) -> dict[str, dict[str, float]]:
    """Reference ÷ each other system, start by start: > 1 means the reference took more time or memory."""
    base = next((r for r in rows if r["system"] == reference and not r.get("failed")), None)
    if base is None:
        return {}
    out = {}
    for row in rows:
        if row is base or row.get("failed"):
            continue
        pairs = {
            "first_answer_x": ("first_token_s", "first_token_s"),
            "peak_resident_x": ("peak_resident_bytes", "peak_resident_bytes"),
            "steady_resident_x": ("resident_after_runs_bytes", "resident_after_runs_bytes"),
            # the target: the reference's peak against the other's steady resident memory
            "peak_vs_their_steady_x": ("peak_resident_bytes", "resident_after_runs_bytes"),
        }
        out[row["system"]] = {
            name: base[mine] / row[theirs]
            for name, (mine, theirs) in pairs.items()
            if base.get(mine) and row.get(theirs)
        }
    return out


def run_served(
    tokenizer, workloads: list[Workload], plan: ServedPlan, progress: Progress = lambda message: None
) -> dict:
    """Every system `repeat` times in rounds (A, B, A, B: a noisy spell hits both); the first round's starts are
    the first loads, later rounds' the reloads."""
    starts: list[dict] = []
    runs: dict[str, dict[str, list[SystemResult]]] = {s.name: {w.name: [] for w in workloads} for s in plan.systems}
    for round_index in range(plan.repeat):
        for system in plan.systems:
            row, results = start_and_run(system, workloads, tokenizer, plan, progress)
            row["round"] = round_index + 1
            if plan.model_bytes and not row.get("failed"):
                written = (row.get("disk_written_start_bytes") or 0) + (row.get("disk_written_run_bytes") or 0)
                row["disk_written_share_of_file"] = written / plan.model_bytes
            starts.append(row)
            for name, result in results.items():
                runs[system.name][name].append(result)
    reference = plan.systems[0].name
    record: dict = {
        "starts": starts,
        "start_ratios": [
            start_ratios([r for r in starts if r["round"] == n + 1], reference) for n in range(plan.repeat)
        ],
        "workloads": {},
    }
    for workload in workloads:
        chosen = [_median(runs[s.name][workload.name]) for s in plan.systems]
        rows = [r.summary() for r in chosen]
        record["workloads"][workload.name] = with_paired_ratios(
            {
                "description": workload.description,
                "requests": len(workload.requests),
                "output_tokens": workload.output_tokens,
                "prompt_tokens": sum(len(r.prompt_ids) for r in workload.requests),
                "systems": rows,
                "repeat": plan.repeat,
                "tokens_per_s_runs": {
                    s.name: [x.summary().get("tokens_per_s") for x in runs[s.name][workload.name]] for s in plan.systems
                },
                "ratios": ratios(rows, reference),
                # not compared: llama.cpp's kernels and the studio's round differently, so greedy replies part ways
                "same_tokens_as": {},
            },
            reference,
        )
    return record
