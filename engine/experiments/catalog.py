"""The one-click experiments: prefill vs decode, batching, prefix sharing, memory pressure, capacity, quantization."""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from engine.errors import StudioError
from engine.experiments.capacity import capacity
from engine.experiments.plumbing import (
    ExperimentContext,
    ExperimentResult,
    Submission,
    greedy,
    ms,
    question,
    rate,
    run_batch,
    system_prompt_text,
    text_prompt,
)
from engine.experiments.pressure import memory_pressure
from engine.load.estimate import format_bytes
from engine.load.loader import estimate_for_spec, load_model
from engine.load.memory import free_memory_bytes
from engine.load.model_source import SourceKind
from engine.load.options import LoadOptions, quantization_problem


def prefill_vs_decode(ctx: ExperimentContext) -> ExperimentResult:
    sizes, tokenizer = ctx.sizes, ctx.loaded.tokenizer
    prompt = text_prompt(tokenizer, sizes.long_prompt_tokens, "Summarise the text above in one sentence.")
    engine = ctx.engine("experiment: prefill vs decode", [len(prompt) + sizes.reply_tokens], prefix_caching=False)
    outcome = run_batch(engine, [Submission(prompt, greedy(sizes.reply_tokens), "prefill vs decode")], ctx)
    stats = outcome.stats[0]
    ttft = stats.ttft_s or 0.0
    prefill_rate = stats.prompt_tokens / ttft if ttft else None
    decode_rate = stats.decode_tokens_per_s
    rows = [
        ["prefill (the prompt, in parallel)", str(stats.prompt_tokens), ms(stats.ttft_s), rate(prefill_rate)],
        [
            "decode (the reply, a pass per token)",
            str(stats.output_tokens - 1),
            ms(stats.e2e_s - ttft),
            rate(decode_rate),
        ],
    ]
    notes = []
    if prefill_rate and decode_rate:
        notes.append(
            f"Prefill handled {prefill_rate / decode_rate:.0f}× more tokens per second than decode: it reads the whole "
            "prompt in one parallel pass per chunk, while decode makes one token per pass and hauls all the weights "
            "for each. The prompt's time shows as the time to first token."
        )
    figures = [
        {"prompt_tokens": stats.prompt_tokens, "prefill_tokens_per_s": prefill_rate, "decode_tokens_per_s": decode_rate}
    ]
    title = "Prefill vs decode: one long prompt, then a long reply"
    return ExperimentResult("prefill_vs_decode", title, ["phase", "tokens", "time", "speed"], rows, notes, figures)


def batching(ctx: ExperimentContext) -> ExperimentResult:
    sizes, tokenizer = ctx.sizes, ctx.loaded.tokenizer
    reply = sizes.batch_reply_tokens
    prompts = [text_prompt(tokenizer, 0, question(i)) for i in range(max(sizes.batch_sizes))]
    engine = ctx.engine("experiment: batching", [len(p) + reply for p in prompts], prefix_caching=False)
    rows, figures = [], []
    for streams in sizes.batch_sizes:
        ctx.say(f"batching: {streams} at once")
        subs = [Submission(prompts[i], greedy(reply), f"{streams} at once #{i + 1}") for i in range(streams)]
        outcome = run_batch(engine, subs, ctx)
        # on the throughput's clock (from submission): a stream's decode pace alone, without its prefill and first
        # token, read faster than the engine's whole output at 1 request (2.9 against 2.1 tok/s)
        per_stream = statistics.median(outcome.stream_tokens_per_s) if outcome.stream_tokens_per_s else None
        figures.append(
            {
                "streams": streams,
                "tokens_per_s": outcome.tokens_per_s,
                "per_stream_tokens_per_s": per_stream,
                "preemptions": outcome.preemptions,
            }
        )
        rows.append(
            [
                str(streams),
                rate(outcome.tokens_per_s),
                rate(per_stream),
                ms(outcome.median("ttft_s")),
                f"{outcome.wall_s:.1f} s",
            ]
        )
    notes = []
    if len(figures) > 1 and figures[0]["tokens_per_s"]:
        gain = figures[-1]["tokens_per_s"] / figures[0]["tokens_per_s"]
        notes.append(
            f"{figures[-1]['streams']} requests at once made {gain:.1f}× the tokens per second of one: a decode pass "
            "hauls the weights once for the whole batch, so each extra stream costs far less than a pass of its own."
        )
    notes.append(
        "Both speeds count from the moment the requests were submitted: the engine's throughput is every token over "
        "the time until the last request finished, a stream's speed (the median) its own tokens over its own time "
        "to its last token, prefill included. One request alone streams at exactly the engine's throughput."
    )
    columns = ["at once", "engine throughput", "per-stream speed", "TTFT (median)", "wall time"]
    return ExperimentResult("batching", "Batching: 1 to many requests at once", columns, rows, notes, figures)


def prefix_sharing(ctx: ExperimentContext) -> ExperimentResult:
    sizes, tokenizer = ctx.sizes, ctx.loaded.tokenizer
    system = system_prompt_text(tokenizer, sizes.system_prompt_tokens)
    params = greedy(sizes.batch_reply_tokens)
    prompts = [text_prompt(tokenizer, 0, question(i), system) for i in range(sizes.prefix_followers + 1)]
    kv_tokens = [len(p) + params.max_tokens for p in prompts]
    rows, figures = [], []
    for caching in (True, False):
        label = f"experiment: prefix sharing, caching {'on' if caching else 'off'}"
        engine = ctx.engine(label, kv_tokens, prefix_caching=caching)
        # the first request computes the shared pages; the followers arrive after it and may reuse them
        first = run_batch(engine, [Submission(prompts[0], params, "same system prompt #1")], ctx)
        subs = [Submission(p, params, f"same system prompt #{i + 2}") for i, p in enumerate(prompts[1:])]
        rest = run_batch(engine, subs, ctx)
        prompt_tokens = sum(len(p) for p in prompts)
        cached = sum(s.cached_prompt_tokens for s in rest.stats)
        prefilled = first.prefill_tokens + rest.prefill_tokens
        follower_ttft = rest.median("ttft_s")
        figures.append(
            {
                "caching": caching,
                "prompt_tokens": prompt_tokens,
                "cached_tokens": cached,
                "prefill_tokens": prefilled,
                "follower_ttft_s": follower_ttft,
            }
        )
        rows.append(["on" if caching else "off", str(prompt_tokens), str(cached), str(prefilled), ms(follower_ttft)])
    notes = [
        "With caching on, the later chats find the system prompt's full pages already computed and prefill only "
        "their own question: fewer prefill tokens, a shorter time to first token. In the page map, shared pages "
        "carry a dot; after the run they stay amber (cached, reusable) until evicted."
    ]
    title = f"Prefix sharing: {len(prompts)} chats with one system prompt"
    columns = ["prefix caching", "prompt tokens", "from cache", "prefilled", "later chats' TTFT (median)"]
    return ExperimentResult("prefix_sharing", title, columns, rows, notes, figures)


def quantization(ctx: ExperimentContext, alternative: LoadOptions | None = None) -> ExperimentResult:
    loaded = ctx.loaded
    current = replace(loaded.info.load_options, device=loaded.info.device)
    alternative = alternative or _alternative_for(current, loaded.info.source_kind)
    columns = ["variant", "weights", "TTFT", "decode speed", "reply begins"]
    title = "Quantization: the same prompt on two variants"
    if alternative is None:
        return ExperimentResult("quantization", title, columns, [], ["No other variant can load here."])
    needed = estimate_for_spec(loaded.source.spec, alternative).weight_bytes
    free = free_memory_bytes(loaded.info.device)
    if free and needed > free * 0.8:
        note = f"Not enough free memory for a second copy ({format_bytes(needed)} needed, {format_bytes(free)} free)."
        return ExperimentResult("quantization", title, columns, [], [note])
    rows, figures = [], []
    reply = ctx.sizes.reply_tokens
    ctx.say(f"quantization: loading {_describe(alternative)}")
    try:
        other = load_model(loaded.source.spec, alternative)
    except StudioError as exc:
        return ExperimentResult("quantization", title, columns, [], [f"Could not load the variant: {exc}"])
    try:
        for variant in (loaded, other):
            label = _describe(LoadOptions(variant.info.dtype, variant.info.quantization.split("+")[0],
                                          variant.info.device))  # fmt: skip
            sub = ExperimentContext(variant, ctx.base_config, ctx.sizes, ctx.on_phase, ctx.progress, ctx.cancelled)
            prompt = text_prompt(variant.tokenizer, 0, "Explain in two sentences why the sky is blue.")
            engine = sub.engine(f"experiment: quantization, {label}", [len(prompt) + reply], prefix_caching=False)
            outcome = run_batch(engine, [Submission(prompt, greedy(reply), label)], ctx)
            stats = outcome.stats[0]
            text = variant.tokenizer.decode(outcome.outputs[0][:12], skip_special_tokens=True).strip()
            figures.append(
                {
                    "variant": label,
                    "weight_bytes": variant.info.weight_bytes,
                    "decode_tokens_per_s": stats.decode_tokens_per_s,
                }
            )
            rows.append(
                [
                    label,
                    format_bytes(variant.info.weight_bytes),
                    ms(stats.ttft_s),
                    rate(stats.decode_tokens_per_s),
                    text + "…",
                ]
            )
            del engine
    finally:
        del other
        gc.collect()
    notes = [
        "Fewer bytes per weight means less to haul per decode pass. On GPUs that usually speeds decode up; on CPUs "
        "bitsandbytes dequantizes on the fly and can be slower. The reply may differ a little: quantization is lossy."
    ]
    return ExperimentResult("quantization", title, columns, rows, notes, figures)


def _alternative_for(current: LoadOptions, source_kind: SourceKind | None = None) -> LoadOptions | None:
    if current.quantization != "none":
        return LoadOptions(dtype=current.dtype, quantization="none", device=current.device)
    for quant in ("nf4", "int8"):
        if quantization_problem(quant, current.device, source_kind) is None:
            dtype = "float32" if current.dtype == "float16" and current.device == "cpu" else current.dtype
            return LoadOptions(dtype=dtype, quantization=quant, device=current.device)
    return None


def _describe(options: LoadOptions) -> str:
    return options.dtype if options.quantization == "none" else f"{options.quantization} ({options.dtype} compute)"


@dataclass(frozen=True)
class Experiment:
    key: str
    title: str
    description: str
    run: Callable[[ExperimentContext], ExperimentResult]


EXPERIMENTS = (
    Experiment("prefill_vs_decode", "Prefill vs decode", "One long prompt, then a long reply.", prefill_vs_decode),
    Experiment("batching", "Batching", "1, 4 and 16 requests at once: throughput and per-stream speed.", batching),
    Experiment(
        "prefix_sharing", "Prefix sharing", "Chats with one system prompt, prefix caching on, then off.", prefix_sharing
    ),
    Experiment(
        "memory_pressure", "Memory pressure", "A KV cache too small for all chats: preemption.", memory_pressure
    ),
    Experiment(
        "capacity",
        "Capacity",
        "How many chats of a given length the KV budget holds before preemption starts, as chats grow longer.",
        capacity,
    ),
    Experiment(
        "quantization", "Quantization", "The same prompt on the loaded model and a quantized copy.", quantization
    ),
)


def experiment(key: str) -> Experiment:
    for candidate in EXPERIMENTS:
        if candidate.key == key:
            return candidate
    raise KeyError(key)
