"""The Capacity experiment: how many chats of a given length one KV budget holds before preemption starts, as the
chats grow longer. What limits a server is how many requests fit before their caches fill memory; a longer allowed
context costs nothing until the traffic is long."""

from __future__ import annotations

from engine.experiments.plumbing import (
    ExperimentContext,
    ExperimentResult,
    Submission,
    greedy,
    pages_for,
    question,
    run_batch,
    text_prompt,
)

MIN_REPLY = 4


def preemptions(count: int) -> str:
    return "no preemption" if count == 0 else f"{count} preemption" + ("" if count == 1 else "s")


def pages_text(chats: int, per_chat: int, budget_pages: int, count: int) -> str:
    """'4 need 64 of 48 pages: 51 preemptions': the arithmetic, then what the run did. A run over the budget without
    a preemption says "yet" rather than read as if the arithmetic held."""
    need = chats * per_chat
    outcome = preemptions(count)
    if need > budget_pages and count == 0:
        outcome = f"yet {outcome}"
    return f"{chats} need {need} of {budget_pages} pages: {outcome}"


def capacity_row(figures: dict, budget_pages: int) -> list[str]:
    """A table row from one length's figures; the text follows the pages each chat needs, so it cannot read "4: no
    preemption" beside a note that says one chat more than fits is preempted."""
    per_chat, fits = figures["pages_per_chat"], figures["fit"]
    return [
        f"{figures['length']} tokens",
        str(per_chat),
        str(fits),
        pages_text(figures["ran_at_once"], per_chat, budget_pages, figures["preemptions_at_fit"]),
        pages_text(fits + 1, per_chat, budget_pages, figures["preemptions_one_more"]),
    ]


def peak_running(engine) -> int:
    """Most requests the engine ran in one step."""
    return max((step.running for step in engine.metrics.snapshot(0, 1 << 62).steps), default=0)


def _run(ctx: ExperimentContext, prompts: list[list[int]], length: int, label: str):
    """Every chat exactly `length` tokens (prompt + reply), all admitted in the first step: with the prefill budget
    that spares streaming chats off, the moment pages run out depends on the lengths alone, not on arrival order."""
    step_tokens = max(ctx.base_config.max_step_tokens or 0, sum(len(p) for p in prompts))
    engine = ctx.engine(
        label,
        pages=ctx.sizes.capacity_pages,
        prefix_caching=False,  # the chats' shared template would otherwise make them look smaller than they are
        # one token per chat per step, so the chats grow side by side as the arithmetic assumes: with drafts, a
        # chat whose drafts hit finished early and freed its pages, and 4 chats of 256 tokens in 48 pages (64
        # needed) ran without a preemption
        speculative=False,
        prefill_budget_s=None,
        max_step_tokens=step_tokens,
        max_running=max(ctx.base_config.max_running, len(prompts)),
    )
    subs = [Submission(p, greedy(max(MIN_REPLY, length - len(p))), f"{length} tokens #{i + 1}")
            for i, p in enumerate(prompts)]  # fmt: skip
    outcome = run_batch(engine, subs, ctx)
    return outcome, peak_running(engine)


def capacity(ctx: ExperimentContext) -> ExperimentResult:
    sizes, tokenizer, page_size = ctx.sizes, ctx.loaded.tokenizer, ctx.sizes.page_size
    budget_pages = sizes.capacity_pages
    budget_tokens = budget_pages * page_size
    rows, figures = [], []
    for length in sizes.capacity_lengths:
        per_chat = pages_for(length, page_size)
        fits = max(1, budget_pages // per_chat)
        # a short question each (the chat template alone takes a few dozen tokens); the reply makes up the length
        prompts = [text_prompt(tokenizer, 0, question(i)) for i in range(fits + 1)]
        ctx.say(f"capacity: {fits} chats of {length} tokens, then {fits + 1}")
        at_fit, ran = _run(ctx, prompts[:fits], length, f"experiment: capacity, {fits} chats of {length} tokens")
        one_more, _ = _run(ctx, prompts, length, f"experiment: capacity, {fits + 1} chats of {length} tokens")
        figures.append(
            {
                "length": length,
                "pages_per_chat": per_chat,
                "fit": fits,
                "ran_at_once": ran,
                "preemptions_at_fit": at_fit.preemptions,
                "preemptions_one_more": one_more.preemptions,
                "tokens_per_s": at_fit.tokens_per_s,
            }
        )
        rows.append(capacity_row(figures[-1], budget_pages))
    notes = [
        f"One KV budget of {budget_pages} pages ({budget_tokens:,} tokens) for every run, every chat admitted at once. "
        f"About {budget_tokens:,} ÷ the chat length fit: that many run side by side without a preemption; one chat "
        "more needs more pages than the budget, so as the replies grow, pages run out and the newest chat is "
        "preempted (its cache dropped, recomputed when it comes back, and preempted again while the others still "
        "grow). Twice as long, half as many. Drafts are off here, so the chats grow side by side, a token a step.",
        "What limits a server is how many requests fit before their caches fill memory, not the longest context it "
        "allows: a long allowed context costs nothing until the traffic itself is long.",
    ]
    columns = ["chat length", "pages each", f"fit in {budget_pages}", "that many", "one more"]
    title = f"Capacity: chats of growing length in one KV budget of {budget_pages} pages"
    return ExperimentResult("capacity", title, columns, rows, notes, figures)
