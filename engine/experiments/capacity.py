"""The Capacity experiment: how many chats of a given length one KV budget holds before preemption starts, as the
average length grows. What limits a server is how many requests fit before their caches fill memory; a longer
allowed context costs nothing until the traffic is long."""

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

EXTRA_CHATS = 2  # more chats than should fit, so the point where preemption starts shows
MIN_REPLY = 4


def held_before_preemption(steps) -> tuple[int, bool]:
    """(most requests running at once before the first preemption, whether one happened) from step records."""
    peak = 0
    for step in steps:
        if step.preemptions:
            return peak, True
        peak = max(peak, step.running)
    return peak, False


def capacity(ctx: ExperimentContext) -> ExperimentResult:
    sizes, tokenizer, page_size = ctx.sizes, ctx.loaded.tokenizer, ctx.sizes.page_size
    budget_pages = sizes.capacity_pages
    budget_tokens = budget_pages * page_size
    rows, figures = [], []
    for length in sizes.capacity_lengths:
        # a short question each (the chat template alone takes a few dozen tokens); the reply makes up the length,
        # as a conversation grows by its replies
        probe = text_prompt(tokenizer, 0, question(0))
        reply = max(MIN_REPLY, length - len(probe))
        per_chat = pages_for(len(probe) + reply, page_size)
        fits = budget_pages // per_chat
        chats = fits + EXTRA_CHATS
        prompts = [text_prompt(tokenizer, 0, question(i)) for i in range(chats)]
        average = sum(len(p) + reply for p in prompts) / chats
        ctx.say(f"capacity: {chats} chats of about {average:.0f} tokens")
        # no prefix caching: the chats' shared template would otherwise make them look smaller than they are
        engine = ctx.engine(
            f"experiment: capacity, chats of ~{average:.0f} tokens", pages=budget_pages, prefix_caching=False
        )
        outcome = run_batch(engine, [Submission(p, greedy(reply), f"~{average:.0f} tokens #{i + 1}")
                                     for i, p in enumerate(prompts)], ctx)  # fmt: skip
        steps = engine.metrics.snapshot(0, 1 << 62).steps
        held, preempted = held_before_preemption(steps)
        figures.append(
            {
                "average_tokens": average,
                "pages_per_chat": per_chat,
                "fit": fits,
                "chats": chats,
                "held_before_preemption": held,
                "preempted": preempted,
                "preemptions": outcome.preemptions,
                "tokens_per_s": outcome.tokens_per_s,
            }
        )
        rows.append(
            [
                f"~{average:.0f} tokens",
                f"{fits} ({budget_pages} pages ÷ {per_chat} per chat)",
                f"{held} of {chats}" if preempted else f"all {chats} (no preemption)",
                str(outcome.preemptions),
                rate(outcome.tokens_per_s),
            ]
        )
        del engine
    notes = [
        f"One KV budget of {budget_pages} pages ({budget_tokens:,} tokens) for every run. Chats are admitted while "
        "their prompts fit; as their replies grow, pages run out and the newest chat is preempted. About "
        f"{budget_tokens:,} ÷ the chat length fit at once: twice as long, half as many.",
        "What limits a server is how many requests fit before their caches fill memory, not the longest context it "
        "allows: a long allowed context costs nothing until the traffic itself is long.",
    ]
    columns = ["average chat length", "fit in the budget", "running when preemption began", "preemptions", "throughput"]
    title = f"Capacity: chats of growing length in one KV budget of {budget_pages} pages"
    return ExperimentResult("capacity", title, columns, rows, notes, figures)
