"""Prometheus exposition of the engine's MetricsRecorder under vLLM's metric names, so vLLM dashboards work."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.core.metrics import MetricsRecorder, StepRecord
from engine.types import FinishReason

# vLLM's bucket boundaries, so histograms line up with a real vLLM's in the same Grafana panel.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
#: a request's phases: end to end, queued, prefill (scheduled to first token), decode, inference (scheduled to end)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
#: per-request phase histograms: (vLLM's name, its help text), read from a finished request's stats
REQUEST_PHASES = {
    "e2e": ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    "queue": ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
    "prefill": ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
    "decode": ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
    "inference": ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
}
REQUEST_TOKENS = {
    "prompt": ("vllm:request_prompt_tokens", "Number of prefill tokens processed."),
    "generation": ("vllm:request_generation_tokens", "Number of generation tokens processed."),
    # one sequence per request here (n = 1): the longest of its sequences is the one
    "max_generation": ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation "
                       "tokens."),
}  # fmt: skip


def token_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 series up to the model's context (build_1_2_5_buckets): 1, 2, 5, 10, 20, 50, ..."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(buckets)
            buckets.append(value)
        exponent += 1


def request_phases(stats: dict) -> dict[str, float]:
    """A finished request's phases in seconds, as vLLM times them (those its stats can tell)."""
    phases = {"e2e": stats["e2e_s"]}
    queue, ttft = stats.get("queue_s"), stats.get("ttft_s")
    if queue is not None:
        phases["queue"] = queue
    if ttft is not None:
        decode = sum(stats.get("inter_token_s") or ())
        prefill = max(0.0, ttft - (queue or 0.0))
        phases.update(prefill=prefill, decode=decode, inference=prefill + decode)
    return phases


@dataclass(frozen=True)
class LiveState:
    """The scheduler right now, read between steps (a StepRecord misses a cancel that came after the step)."""

    running: int
    waiting: int
    pages_used: int
    pages_total: int


def live_state_of(engine) -> LiveState:
    """Runs in the engine thread (EngineThread.call)."""
    return LiveState(
        len(engine.scheduler.running), len(engine.scheduler.waiting), engine.pool.num_used, engine.pool.num_pages
    )


class _Histogram:
    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for index, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[index] += 1
                return

    def family(self, name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=["model_name"])
        cumulative, buckets = 0, []
        for bound, count in zip(self.bounds, self.counts, strict=True):
            cumulative += count
            buckets.append((repr(float(bound)), cumulative))
        buckets.append(("+Inf", self.count))
        family.add_metric(labels, buckets, self.sum)
        return family


def _label(value: object) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


class EngineCollector(Collector):
    """Reads a MetricsRecorder at scrape time. Histograms accumulate the token records that arrived since the
    previous scrape (the recorder's ring buffer holds 64k tokens, far more than arrive between two scrapes).
    `live` optionally returns the scheduler's current state; without it the last step's figures are used."""

    def __init__(
        self,
        recorder: MetricsRecorder,
        model_name: str,
        live: Callable[[], LiveState | None] | None = None,
        runtime: dict[str, object] | None = None,
        context_length: int = 4096,
    ) -> None:
        """runtime: the engine's record of what runs (engine/core/runtime.py), exposed as an info metric.
        context_length: the top of the token-count histograms' buckets (vLLM's max_model_len)."""
        self.recorder = recorder
        self.runtime = runtime
        self.model_name = model_name
        self.live = live
        self._lock = threading.Lock()
        self._step_cursor = 0
        self._token_cursor = 0
        self._finished_cursor = 0
        self._last_step: StepRecord | None = None
        self._ttft = _Histogram(TTFT_BUCKETS)
        self._itl = _Histogram(ITL_BUCKETS)
        self._phases = {phase: _Histogram(REQUEST_LATENCY_BUCKETS) for phase in REQUEST_PHASES}
        self._tokens = {kind: _Histogram(token_buckets(context_length)) for kind in REQUEST_TOKENS}

    def _update(self):
        snapshot = self.recorder.snapshot(self._step_cursor, self._token_cursor, self._finished_cursor)
        if snapshot.steps:
            self._last_step = snapshot.steps[-1]
        self._step_cursor, self._token_cursor = snapshot.next_step, snapshot.next_token
        self._finished_cursor = snapshot.next_finished
        for record in snapshot.tokens:
            (self._ttft if record.index == 0 else self._itl).observe(record.latency_s)
        for stats in snapshot.finished:
            if stats.get("finish_reason") == FinishReason.ERROR:
                continue  # as vLLM: a failed request is no sample of how long requests take
            for phase, seconds in request_phases(stats).items():
                self._phases[phase].observe(seconds)
            generated = stats.get("output_tokens", 0)
            self._tokens["prompt"].observe(stats.get("prompt_tokens", 0))
            self._tokens["generation"].observe(generated)
            self._tokens["max_generation"].observe(generated)
        return snapshot.totals

    def _current(self) -> LiveState:
        state = self.live() if self.live is not None else None
        if state is not None:
            return state
        step = self._last_step
        if step is None:
            return LiveState(0, 0, 0, 0)
        return LiveState(step.running, step.waiting, step.pages_used, step.pages_total)

    def collect(self) -> Iterator[Metric]:
        labels = [self.model_name]
        with self._lock:
            totals = self._update()
            state = self._current()

            def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
                family = GaugeMetricFamily(name, doc, labels=["model_name"])
                family.add_metric(labels, value)
                return family

            def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
                # prometheus_client appends `_total` to counter samples: vllm:prompt_tokens -> vllm:prompt_tokens_total
                family = CounterMetricFamily(name, doc, labels=["model_name"])
                family.add_metric(labels, value)
                return family

            yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", state.running)
            yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", state.waiting)
            usage = state.pages_used / state.pages_total if state.pages_total else 0.0
            yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
            # vLLM's older name, still read by its Grafana dashboard's cache panel
            yield gauge("vllm:gpu_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
            yield counter(
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                totals.prefix_query_tokens,
            )
            yield counter(
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                totals.prefix_hit_tokens,
            )
            yield counter(
                "vllm:num_preemptions", "Cumulative number of preemption from the engine.", totals.preemptions
            )
            yield counter(
                "vllm:prompt_tokens",
                "Number of prefill tokens processed (counted when a request ends).",
                totals.prompt_tokens,
            )
            yield counter("vllm:generation_tokens", "Number of generation tokens processed.", totals.generation_tokens)
            yield counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", totals.draft_tokens)
            yield counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", totals.accepted_tokens)
            success = CounterMetricFamily(
                "vllm:request_success",
                "Count of successfully processed requests.",
                labels=["model_name", "finished_reason"],
            )
            for reason, count in sorted(totals.finish_reasons.items()):
                if reason != FinishReason.ERROR:
                    success.add_metric([self.model_name, reason], count)
            yield success
            yield self._ttft.family(
                "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels
            )
            yield self._itl.family(
                "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels
            )
            # the same samples under the name vLLM's dashboard reads (vLLM observes both per token)
            yield self._itl.family(
                "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", labels
            )
            for phase, (name, doc) in REQUEST_PHASES.items():
                yield self._phases[phase].family(name, doc, labels)
            for kind, (name, doc) in REQUEST_TOKENS.items():
                yield self._tokens[kind].family(name, doc, labels)
            yield from self._engine_info(totals)

    def _engine_info(self, totals) -> Iterator[Metric]:
        """What runs (formats, kernels, the fast path's check), and the prefill stall the streams saw."""
        if self.runtime is not None:
            keys = sorted(self.runtime)
            info = GaugeMetricFamily(
                "inference_studio_engine_info",
                "What the engine runs: device, formats, kernels, the fast path and its check (value always 1).",
                labels=["model_name", *keys],
            )
            values = [
                ", ".join(map(str, v)) if isinstance(v, list) else str(v) for v in (self.runtime[k] for k in keys)
            ]
            info.add_metric([self.model_name, *values], 1)
            yield info
        stall = CounterMetricFamily(
            "inference_studio_prefill_stall_seconds",
            "Time decoding streams waited because a step also prefilled prompts (summed over steps).",
            labels=["model_name"],
        )
        stall.add_metric([self.model_name], totals.prefill_stall_s)
        yield stall
