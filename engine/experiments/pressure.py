"""The Memory pressure experiment: chats in a KV pool too small for all of them, against a run with ample memory,
and what preemption did to the replies (nothing, in float32; where the arithmetic depends on the batch shape, from
which token they part)."""

from __future__ import annotations

from engine.experiments.plumbing import (
    ExperimentContext,
    ExperimentResult,
    Submission,
    greedy,
    pages_for,
    question,
    rate,
    run_batch,
    text_prompt,
)
from engine.model.compiled_step import rows_up_to
from engine.model.dense_rows import ENV as CLAIMED_ENV  # "never": oneDNN's products for every step size

CLAIMED_WORDS = "claimed dot products"  # how compute_precision names them, and replies_note recognises them
EXACT_FORMATS = {"float32"}  # formats whose results do not depend on how many rows are computed together


def compute_precision(engine) -> tuple[str, bool]:
    """(what the engine's layers compute in, in words; whether that arithmetic is exact whatever the batch shape)."""
    record = engine.runtime_record()
    formats = set(record["layer_formats"])
    quant = engine.loaded.info.quantization
    words = ", ".join(sorted(formats))
    if quant != "none":
        words = f"{quant} weights ({words} arithmetic)"
    claimed = int(record.get("claimed_rows") or 0)
    if claimed:  # measured faster here for a chat's decode steps (dense_rows.py); their sums run in another order
        words += f" ({CLAIMED_WORDS} at {rows_up_to(claimed)}, oneDNN's products at more)"
    return words, quant == "none" and formats <= EXACT_FORMATS and not claimed


def first_divergence(reference: list[list[int]], other: list[list[int]]) -> tuple[int, int] | None:
    """(chat index, token index) where the earliest-parting pair of replies first differs; None if all are equal."""
    found = None
    for chat, (a, b) in enumerate(zip(reference, other, strict=True)):
        if a == b:
            continue
        token = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        if found is None or token < found[1]:
            found = (chat, token)
    return found


def replies_note(divergence: tuple[int, int] | None, precision: str, exact: bool) -> str:
    """What preemption did to the replies, in words that cannot contradict themselves."""
    if divergence is None:
        return (
            "The replies are identical, token for token, to the run with ample memory: preemption cost only time. "
            f"(This model computes in {precision}.)"
        )
    chat, token = divergence
    if CLAIMED_WORDS in precision:  # float32 already: what makes it batch-invariant is one product for every size
        remedy = (f"With {CLAIMED_ENV}=never in the environment, one product serves every step size: the replies are "
                  "identical and preemption costs only time.")  # fmt: skip
    else:
        remedy = ("Loaded with the dtype float32, the model computes the same numbers whatever the batch, the "
                  "replies are identical and preemption costs only time.")  # fmt: skip
    where = f"token {token + 1} of chat #{chat + 1}"
    if exact:
        return (
            f"The replies differ from the run with ample memory from {where}, although this model computes in "
            f"{precision}, where they should be identical: that is a bug worth reporting."
        )
    return (
        f"The replies match the run with ample memory up to {where}, then part. This model computes in "
        f"{precision}: there the rounding of a matrix product depends on the batch shape (how many rows run "
        "together, and a preempted chat is recomputed in one pass instead of token by token), so a nearly tied "
        f"next token can come out the other way. {remedy}"
    )


def memory_pressure(ctx: ExperimentContext) -> ExperimentResult:
    sizes, tokenizer = ctx.sizes, ctx.loaded.tokenizer
    reply = sizes.pressure_reply_tokens
    prompts = [text_prompt(tokenizer, 0, question(i)) for i in range(sizes.pressure_streams)]
    need = sum(pages_for(len(p) + reply, sizes.page_size) for p in prompts)
    largest = max(pages_for(len(p) + reply, sizes.page_size) for p in prompts)
    # room for the largest request and a bit; well short of all of them at once
    tight_pages = max(largest + 2, need * 3 // 5)
    rows, figures, outputs = [], [], []
    precision, exact = "", True
    for label, pages in (("ample", need + 4), ("tight", tight_pages)):
        engine = ctx.engine(f"experiment: memory pressure, {label} KV", pages=pages, prefix_caching=False)
        precision, exact = compute_precision(engine)
        subs = [Submission(p, greedy(reply), f"{label} KV #{i + 1}") for i, p in enumerate(prompts)]
        outcome = run_batch(engine, subs, ctx)
        outputs.append(outcome.outputs)
        figures.append({"kv_pages": pages, "preemptions": outcome.preemptions, "tokens_per_s": outcome.tokens_per_s})
        rows.append([label, f"{pages} (all need {need})", str(outcome.preemptions), rate(outcome.tokens_per_s)])
    divergence = first_divergence(outputs[0], outputs[1])
    figures[-1].update(identical_outputs=divergence is None, first_divergence=divergence, compute_precision=precision)
    notes = [
        "With too few pages the newest request is preempted: its pages go back to the pool and it is recomputed "
        "later. The KV charts mark each preemption with a red cross.",
        replies_note(divergence, precision, exact),
    ]
    title = f"Memory pressure: {len(prompts)} chats in a small KV cache"
    columns = ["KV budget", "pages", "preemptions", "engine throughput"]
    return ExperimentResult("memory_pressure", title, columns, rows, notes, figures)
