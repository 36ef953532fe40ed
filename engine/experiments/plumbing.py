"""Experiment plumbing: sizes, results, temporary engines on the loaded model, and the step loop they share."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.core.metrics import MetricsSnapshot
from engine.core.prompts import encode_prompt
from engine.errors import StudioError
from engine.load.loader import LoadedModel
from engine.types import RequestStats, SamplingParams

#: called when an experiment starts a phase on an engine: (its metrics snapshot function, a label)
PhaseListener = Callable[[Callable[[int, int], MetricsSnapshot], str], None]


class ExperimentCancelled(StudioError):
    """The user stopped the experiment."""


@dataclass(frozen=True)
class ExperimentSizes:
    """How big each experiment's requests are; tests shrink them to run on a tiny model in a moment."""

    long_prompt_tokens: int = 400
    reply_tokens: int = 32
    batch_sizes: tuple[int, ...] = (1, 4, 16)
    batch_reply_tokens: int = 16
    system_prompt_tokens: int = 192
    prefix_followers: int = 3
    pressure_streams: int = 6
    pressure_reply_tokens: int = 32
    capacity_pages: int = 48  # the Capacity experiment's KV budget
    capacity_lengths: tuple[int, ...] = (64, 128, 256)  # chat lengths it tries (prompt + reply, tokens)
    page_size: int = 16

    @classmethod
    def small(cls) -> ExperimentSizes:
        return cls(
            long_prompt_tokens=48,
            reply_tokens=6,
            batch_sizes=(1, 3),
            batch_reply_tokens=5,
            system_prompt_tokens=24,
            prefix_followers=2,
            pressure_streams=3,
            pressure_reply_tokens=12,
            capacity_pages=40,
            capacity_lengths=(64, 96),
            page_size=4,
        )


@dataclass
class ExperimentResult:
    """A summary table (strings, ready to show) plus the same figures as numbers for tests and exports."""

    name: str
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    figures: list[dict] = field(default_factory=list)


@dataclass
class ExperimentContext:
    loaded: LoadedModel
    base_config: EngineConfig
    sizes: ExperimentSizes = field(default_factory=ExperimentSizes)
    on_phase: PhaseListener | None = None
    progress: Callable[[str], None] | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)

    def engine(self, label: str, request_tokens: Sequence[int] = (), pages: int | None = None, **config) -> Engine:
        """A temporary engine on the loaded model with its own page pool: `pages`, or room for requests of
        `request_tokens` tokens (prompt + reply) all at once, and a few pages spare. The dashboard is told."""
        page_size = self.sizes.page_size
        if pages is None:
            pages = sum(pages_for(n, page_size) for n in request_tokens) + 4
        base = replace(self.base_config, page_size=page_size, kv_pages=pages, metrics_capacity=4096)
        engine = Engine(self.loaded, replace(base, **config))
        if self.on_phase is not None:
            self.on_phase(engine.metrics.snapshot, label)
        self.say(label)
        return engine

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)


@dataclass
class Submission:
    prompt_ids: list[int]
    params: SamplingParams
    tag: str


@dataclass
class BatchOutcome:
    """What one batch of requests did on an engine: per-request stats, outputs, and times on one clock that starts
    when the batch was submitted: each request's finish, and the wall time (until the last one finished)."""

    stats: list[RequestStats]
    outputs: list[list[int]]
    wall_s: float
    preemptions: int
    prefix_hit_tokens: int
    prefill_tokens: int
    finished_s: list[float] = field(default_factory=list)  # per request, since submission

    @property
    def output_tokens(self) -> int:
        return sum(s.output_tokens for s in self.stats)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def stream_tokens_per_s(self) -> list[float]:
        """Each request's tokens over its own time from submission to its last token (its wait and prefill
        included): the throughput's time base, so one request alone streams exactly at the engine's throughput."""
        return [s.output_tokens / t for s, t in zip(self.stats, self.finished_s, strict=True) if t > 0]

    def median(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.stats if getattr(s, name) is not None]
        return statistics.median(values) if values else None


def run_batch(engine: Engine, submissions: Sequence[Submission], ctx: ExperimentContext) -> BatchOutcome:
    """Submit everything at once and step the engine (in this thread) until all of it finished."""
    totals_before = engine.metrics.snapshot(1 << 62, 1 << 62).totals
    started = time.monotonic()
    ids = [engine.add_request(s.prompt_ids, s.params, tag=s.tag).request_id for s in submissions]
    stats: dict[str, RequestStats] = {}
    finished: dict[str, float] = {}
    outputs: dict[str, list[int]] = {rid: [] for rid in ids}
    while engine.has_unfinished:
        if ctx.cancelled.is_set():
            for rid in ids:
                engine.abort(rid)
            raise ExperimentCancelled("the experiment was stopped")
        for event in engine.step():
            outputs[event.request_id].extend(event.token_ids)
            if event.finished and event.stats is not None:
                if event.error:
                    raise StudioError(f"an experiment request failed: {event.error}")
                stats[event.request_id] = event.stats
                finished[event.request_id] = time.monotonic() - started
    # the wall time ends with the last request, on the same clock as each one's finish (not a moment later)
    wall = max(finished.values(), default=time.monotonic() - started)
    totals = engine.metrics.snapshot(1 << 62, 1 << 62).totals
    return BatchOutcome(
        stats=[stats[rid] for rid in ids],
        outputs=[outputs[rid] for rid in ids],
        wall_s=wall,
        preemptions=totals.preemptions - totals_before.preemptions,
        prefix_hit_tokens=totals.prefix_hit_tokens - totals_before.prefix_hit_tokens,
        prefill_tokens=totals.prefill_tokens - totals_before.prefill_tokens,
        finished_s=[finished[rid] for rid in ids],
    )


_QUESTIONS = (
    "Why is the sky blue?",
    "What does a compiler do?",
    "How does a refrigerator work?",
    "Name three uses of a hash table.",
    "Why do leaves change colour in autumn?",
    "What is a page in virtual memory?",
    "How do vaccines train the immune system?",
    "Why does ice float on water?",
)


def question(i: int) -> str:
    return f"{_QUESTIONS[i % len(_QUESTIONS)]} (question {i + 1})"


_FILLER = (
    "The history of computing is a story of moving data: from punched cards to magnetic drums, from core memory "
    "to caches stacked on the processor, every generation of machines has been shaped by how fast numbers can be "
    "brought to the arithmetic units and carried away again. "
)


def text_prompt(tokenizer, tokens: int, question: str, system: str | None = None) -> list[int]:
    """A chat prompt of at least `tokens` tokens (filler text before the question), with the model's template."""
    filler = ""
    while True:
        messages = [{"role": "user", "content": f"{filler}{question}"}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        ids = encode_prompt(tokenizer, messages=messages)
        if len(ids) >= tokens or len(filler) > tokens * 16:
            return ids
        filler += _FILLER


def system_prompt_text(tokenizer, tokens: int) -> str:
    """A system prompt of at least `tokens` tokens on its own."""
    text = "You are a patient teacher. "
    while len(encode_prompt(tokenizer, prompt=text, raw=True)) < tokens and len(text) < tokens * 16:
        text += _FILLER
    return text


def greedy(max_tokens: int) -> SamplingParams:
    """Fixed-length greedy replies: every run makes the same tokens, so runs compare like with like."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def rate(value: float | None, unit: str = "tok/s") -> str:
    return "–" if value is None else f"{value:.1f} {unit}"


def ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.0f} ms"


def pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)
