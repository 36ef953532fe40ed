"""What a user would pick instead of the engine: transformers `generate` one request at a time, one
left-padded static batch (in waves when requests arrive over time), and transformers' own continuous
batching (`generate_batch`). All greedy, EOS ignored, so every system makes the same tokens."""

from __future__ import annotations

import contextlib
import time
import warnings

import torch
from transformers.generation.streamers import BaseStreamer

from engine.bench.results import RequestTiming, SystemResult
from engine.bench.workloads import Workload
from engine.core.config import DEFAULT_KV_MEMORY
from engine.model.geometry import attention_geometry
from engine.model.reference import transformers_mode


class _StepClock(BaseStreamer):
    """Records when each generation step produced its tokens (the first put() is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if self._prompt_seen:
            self.times.append(time.perf_counter())
        self._prompt_seen = True

    def end(self) -> None:
        pass


def standard_attention(model):
    """Baselines run the model as transformers built it (its SDPA attention, no engine kernels)."""
    return transformers_mode(model)


def _pad_id(model, tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, model.config.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def generate_padded(model, pad_id: int, prompts: list[list[int]], max_new: int) -> tuple[list[list[int]], list[float]]:
    """Left-padded greedy generate of exactly max_new tokens per row; returns outputs and step times."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    clock = _StepClock()
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),  # always: this model's pad token is a chat token
            max_new_tokens=max_new,
            min_new_tokens=max_new,  # ignore EOS so every system makes the same number of tokens
            do_sample=False,
            pad_token_id=pad_id,
            streamer=clock,
        )
    return out[:, width:].tolist(), clock.times


def run_sequential(model, tokenizer, workload: Workload, start: float) -> SystemResult:
    """transformers `generate`, one request at a time in arrival order."""
    pad = _pad_id(model, tokenizer)
    timings, outputs = [], []
    with standard_attention(model):
        for request in workload.requests:
            arrival = start + request.arrival_s
            _sleep_until(arrival)
            tokens, times = generate_padded(model, pad, [request.prompt_ids], request.max_new_tokens)
            timings.append(RequestTiming(arrival, times[: request.max_new_tokens]))
            outputs.append(tokens[0][: request.max_new_tokens])
    return SystemResult("hf-generate-sequential", time.perf_counter() - start, timings, outputs)


def run_static(model, tokenizer, workload: Workload, start: float) -> SystemResult:
    """transformers `generate` on left-padded static batches: everything that has arrived when the previous
    batch finishes forms the next one, which runs until its longest request is done."""
    pad = _pad_id(model, tokenizer)
    pending = sorted(enumerate(workload.requests), key=lambda item: item[1].arrival_s)
    timings: dict[int, RequestTiming] = {}
    outputs: dict[int, list[int]] = {}
    waves = 0
    with standard_attention(model):
        while pending:
            _sleep_until(start + pending[0][1].arrival_s)
            now = time.perf_counter() - start
            wave = [item for item in pending if item[1].arrival_s <= now]
            pending = pending[len(wave) :]
            waves += 1
            max_new = max(r.max_new_tokens for _, r in wave)
            tokens, times = generate_padded(model, pad, [r.prompt_ids for _, r in wave], max_new)
            for (index, request), row in zip(wave, tokens, strict=True):
                timings[index] = RequestTiming(start + request.arrival_s, times[: request.max_new_tokens])
                outputs[index] = row[: request.max_new_tokens]
    order = sorted(timings)
    return SystemResult(
        "hf-static-batch",
        time.perf_counter() - start,
        [timings[i] for i in order],
        [outputs[i] for i in order],
        extra={"waves": waves},
    )


def run_generate_batch(
    model, tokenizer, workload: Workload, start: float, kv_memory_bytes: int = DEFAULT_KV_MEMORY
) -> SystemResult:
    """transformers' own continuous batching: its manager, requests added as they arrive, with the same KV
    memory budget as the engine (by default it sizes its cache from free RAM, taking most of it)."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max(r.max_new_tokens for r in workload.requests))
    with standard_attention(model), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        manager = model.init_continuous_batching(
            generation_config=config, continuous_batching_config=_batching_config(model, kv_memory_bytes)
        )
        manager.start()
        try:
            _warm_up_manager(manager)
            start = time.perf_counter()
            results, timings = _feed_manager(manager, workload, start)
        finally:
            manager.stop(block=True)
            with contextlib.suppress(Exception):
                model.destroy_cached_continuous_batching_manager()
    wall = time.perf_counter() - start
    ordered = sorted(results.items(), key=lambda item: timings[item[0]][0])
    request_timings = []
    outputs = []
    for rid, result in ordered:
        index, arrival = timings[rid]
        stamps = list(result.timestamps or [])
        request_timings.append(RequestTiming(arrival, stamps[: workload.requests[index].max_new_tokens]))
        outputs.append(list(result.generated_tokens)[: workload.requests[index].max_new_tokens])
    return SystemResult("hf-generate-batch", wall, request_timings, outputs)


#: an EOS id no token has, so every request of the manager makes exactly its max_new_tokens
_NEVER = -1


def _batching_config(model, kv_memory_bytes: int):
    """The manager's cache sized to the engine's KV budget."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    per_token = attention_geometry(model.config).kv_bytes_per_token(next(model.parameters()).element_size())
    cb_config = ContinuousBatchingConfig()
    tokens = min(kv_memory_bytes // per_token, 65536)  # its other buffers grow with the block count too
    cb_config.num_blocks = max(8, tokens // cb_config.page_size)
    return cb_config


def _warm_up_manager(manager) -> None:
    """The manager's first request pays a one-time setup (cache sizing, allocation) of many seconds; like every
    system here, it is measured warm."""
    manager.add_request([1, 2, 3], request_id="warm-up", max_new_tokens=2, eos_token_id=_NEVER)
    while not ((result := manager.get_result(timeout=0.05)) is not None and result.is_finished()):
        _check_running(manager)


def _feed_manager(manager, workload: Workload, start: float) -> tuple[dict[str, object], dict[str, tuple[int, float]]]:
    """Each request added at its arrival time, until every one has finished: (results, (index, arrival) by id)."""
    timings: dict[str, tuple[int, float]] = {}
    results: dict[str, object] = {}
    pending = sorted(enumerate(workload.requests), key=lambda item: item[1].arrival_s)
    while pending or len(results) < len(workload.requests):
        now = time.perf_counter()
        while pending and start + pending[0][1].arrival_s <= now:
            index, request = pending.pop(0)
            rid = manager.add_request(
                request.prompt_ids,
                request_id=f"bench-{index}",
                max_new_tokens=request.max_new_tokens,
                record_timestamps=True,
                eos_token_id=_NEVER,
            )
            timings[rid] = (index, start + request.arrival_s)
        result = manager.get_result(timeout=0.01)
        if result is None:
            _check_running(manager)
        elif result.is_finished():
            if result.error:
                raise RuntimeError(f"generate_batch failed: {result.error}")
            results[result.request_id] = result
    return results, timings


def run_llama_cpp(gguf_path: str, tokenizer, workload: Workload, start: float, threads: int) -> SystemResult:
    """llama-cpp-python on the original GGUF, one request at a time (as its server serializes them)."""
    from llama_cpp import Llama

    llm = Llama(model_path=gguf_path, n_ctx=4096, n_threads=threads, verbose=False)
    timings, outputs = [], []
    start = time.perf_counter()
    for request in workload.requests:
        arrival = start + request.arrival_s
        _sleep_until(arrival)
        llm.reset()
        times, tokens = [], []
        for token in llm.generate(request.prompt_ids, temp=0.0, top_k=1):
            times.append(time.perf_counter())
            tokens.append(token)
            if len(tokens) >= request.max_new_tokens:
                break
        timings.append(RequestTiming(arrival, times))
        outputs.append(tokens)
    return SystemResult("llama-cpp-python", time.perf_counter() - start, timings, outputs)


def _check_running(manager) -> None:
    if not manager.is_running():
        raise RuntimeError("transformers' continuous batching thread stopped (see its log above)")


def _sleep_until(moment: float) -> None:
    delay = moment - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
