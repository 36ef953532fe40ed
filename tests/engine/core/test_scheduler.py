"""Scheduler decisions without a model: decode first, token budget, chunked prefill, preemption, prefix hits."""

from __future__ import annotations

from engine.core.config import EngineConfig
from engine.core.page_pool import PagePool
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.types import FinishReason, SamplingParams


def make(pages: int = 16, page_size: int = 4, **config) -> Scheduler:
    cfg = EngineConfig(page_size=page_size, kv_pages=pages, **config)
    return Scheduler(cfg, PagePool(pages, page_size, cfg.prefix_caching))


def request(rid: str, n: int, first: int = 0) -> Request:
    return Request(rid, list(range(first, first + n)), SamplingParams(max_tokens=100))


def run_step(s: Scheduler, sample_token: int = 7):
    """Schedule, pretend the model ran, append a token to every sampling request."""
    out = s.schedule()
    for chunk in out.chunks:
        s.commit(chunk)
        if chunk.samples:
            chunk.request.output_ids.append(sample_token)
    return out


def test_new_requests_are_prefilled_then_decoded_one_token_per_step() -> None:
    s = make()
    a, b = request("a", 6), request("b", 3)
    s.add(a)
    s.add(b)
    out = run_step(s)
    assert [(c.request.request_id, c.num_tokens, c.samples) for c in out.chunks] == [("a", 6, True), ("b", 3, True)]
    assert out.prefill_tokens == 9 and out.decode_tokens == 0
    out = run_step(s)
    assert [(c.request.request_id, c.num_tokens) for c in out.chunks] == [("a", 1), ("b", 1)]
    assert out.decode_tokens == 2
    assert len(a.page_table) == 2 and len(b.page_table) == 1  # pages only as tokens arrive


def test_token_budget_chunks_a_long_prompt_and_decodes_go_first() -> None:
    s = make(pages=64, max_step_tokens=8)
    short = request("short", 3)
    s.add(short)
    run_step(s)
    long = request("long", 20, first=100)
    s.add(long)
    out = run_step(s)
    assert [(c.request.request_id, c.num_tokens, c.samples) for c in out.chunks] == [
        ("short", 1, True),
        ("long", 7, False),
    ]
    out = run_step(s)
    assert [(c.request.request_id, c.num_tokens) for c in out.chunks] == [("short", 1), ("long", 7)]
    out = run_step(s)
    assert [(c.request.request_id, c.num_tokens, c.samples) for c in out.chunks] == [
        ("short", 1, True),
        ("long", 6, True),
    ]
    assert long.num_computed == 20 and len(long.output_ids) == 1


def test_max_running_caps_admission() -> None:
    s = make(max_running=2)
    for rid in "abc":
        s.add(request(rid, 2))
    out = run_step(s)
    assert [c.request.request_id for c in out.chunks] == ["a", "b"]
    assert [r.request_id for r in s.waiting] == ["c"]
    s.finish(s.running[0], FinishReason.STOP)
    out = run_step(s)
    assert "c" in [c.request.request_id for c in out.chunks]


def test_preemption_takes_the_newest_and_requeues_it_first() -> None:
    s = make(pages=6, page_size=2)
    a, b = request("a", 3), request("b", 3, first=50)
    s.add(a)
    s.add(b)
    for _ in range(10):
        out = run_step(s)
        if out.preempted:
            break
    assert [r.request_id for r in out.preempted] == ["b"]
    assert b.status is RequestStatus.WAITING and s.waiting[0] is b and b.page_table == [] and b.preemptions == 1
    assert [c.request.request_id for c in out.chunks] == ["a"]  # the oldest keeps decoding
    assert s.pool.num_used == len(a.page_table)
    s.finish(a, FinishReason.STOP)
    out = run_step(s)
    chunk = out.chunks[0]
    # recomputed: from the start, or from the full pages it left in the prefix cache
    assert chunk.request is b and chunk.samples and chunk.start % 2 == 0
    assert chunk.start + chunk.num_tokens == b.num_tokens - 1  # run_step appended the sampled token


def test_a_request_alone_that_outgrows_the_pool_is_ended() -> None:
    s = make(pages=2, page_size=2)
    a = request("a", 3)
    s.add(a)
    run_step(s)
    out = run_step(s)
    assert out.out_of_pages == [] and len(a.page_table) == 2
    out = run_step(s)
    assert out.out_of_pages == [a]


def test_prefix_pages_are_shared_and_the_last_token_is_always_computed() -> None:
    s = make(pages=16, page_size=4)
    system = list(range(100, 112))  # three full pages
    first = Request("first", [*system, 1, 2], SamplingParams())
    s.add(first)
    run_step(s)
    second = Request("second", [*system, 3], SamplingParams())
    s.add(second)
    out = run_step(s)
    chunk = next(c for c in out.chunks if c.request is second)
    assert second.cached_prompt_tokens == 12 and chunk.num_tokens == 1 and chunk.start == 12
    assert second.page_table[:3] == first.page_table[:3]
    assert all(s.pool.ref_counts[p] == 2 for p in first.page_table[:3])
    assert out.prefix_hit_tokens == 12 and out.prefix_query_tokens == 13
    whole = Request("whole", list(system), SamplingParams())  # entirely cached: still computes one token
    s.add(whole)
    out = run_step(s)
    chunk = next(c for c in out.chunks if c.request is whole)
    assert whole.cached_prompt_tokens == 8 and chunk.num_tokens == 4


def test_finish_frees_pages_and_cached_pages_stay_findable() -> None:
    s = make(pages=8, page_size=4)
    a = request("a", 9)
    s.add(a)
    run_step(s)
    pages = list(a.page_table)
    s.finish(a, FinishReason.STOP)
    assert s.pool.num_used == 0 and a.page_table == []
    assert s.pool.num_cached_free == 2  # two full pages of prompt
    b = request("b", 9)
    s.add(b)
    run_step(s)
    assert b.page_table[:2] == pages[:2] and b.cached_prompt_tokens == 8


def test_prefix_caching_off() -> None:
    s = make(prefix_caching=False)
    a = request("a", 9)
    s.add(a)
    run_step(s)
    s.finish(a, FinishReason.STOP)
    b = request("b", 9)
    s.add(b)
    run_step(s)
    assert b.cached_prompt_tokens == 0 and s.pool.num_cached_free == 0


class EagerDrafter:
    """Proposes `length` draft tokens for every decoding request, every step (as many as a repeating text gives)."""

    def __init__(self, length: int = 8) -> None:
        self.length = length

    def propose(self, request_id: str, tokens: list[int]) -> list[int]:
        return [7] * self.length

    def learn(self, request_id: str, drafted: int, accepted: int) -> None:
        pass

    def forget(self, request_id: str) -> None:
        pass


def drafting(pages: int, page_size: int = 4) -> Scheduler:
    cfg = EngineConfig(page_size=page_size, kv_pages=pages)
    return Scheduler(cfg, PagePool(pages, page_size, cfg.prefix_caching), drafter=EagerDrafter())


def test_a_lone_requests_draft_uses_only_the_free_pages_and_never_ends_it() -> None:
    s = drafting(pages=4)  # 16 slots
    a = request("a", 10)
    s.add(a)
    run_step(s)  # the prompt: 3 pages, then its first token
    out = run_step(s)
    assert out.out_of_pages == [] and not a.is_finished
    (chunk,) = out.chunks
    # the token to compute (position 10) and a draft up to the pool's last slot: 16 - 11 = 5 tokens
    assert len(chunk.draft) == 5 and chunk.start + chunk.num_tokens == 16 and len(a.page_table) == 4
    for _ in range(5):  # without drafts it makes its tokens until the pool is full
        out = run_step(s)
        assert out.out_of_pages == [] and all(len(c.draft) <= 15 - c.start for c in out.chunks)
    assert a.num_computed == 16 and run_step(s).out_of_pages == [a]


def test_a_draft_never_preempts_and_leaves_the_pages_others_need() -> None:
    s = drafting(pages=7)
    a, b = request("a", 10), request("b", 6, first=50)
    s.add(a)
    s.add(b)
    run_step(s)  # a: 3 pages, b: 2 pages; 2 free
    out = run_step(s)
    assert out.preempted == [] and b.status is RequestStatus.RUNNING
    draft = {c.request.request_id: len(c.draft) for c in out.chunks}
    # the watermark (1 page) stays free while others run: a drafts into its own page and the one other free page
    assert s.pool.num_free == s.watermark and draft["a"] == 12 + 4 - 11
    assert draft["b"] == 8 - 7  # and b within its own last page


def test_a_short_prompt_arriving_beside_a_long_one_is_prefilled_first() -> None:
    """The issue's stall: a 6,169-token prompt in progress, a live stream decoding, then a new short question. The
    step's prefill budget (here 8 tokens, as the time budget gives beside a stream) used to go to the long prompt
    whole, so the question waited for every token of it; now the question is prefilled at once, the long prompt goes
    on with what is left (at least a page a step), and the live stream decodes every step."""
    s = make(pages=256, page_size=4, max_step_tokens=32)
    s.prefill_tokens_for = lambda decode_rows: 8 if decode_rows else 32
    live = request("live", 3)
    s.add(live)
    run_step(s)
    long = request("long", 600, first=1000)
    s.add(long)
    run_step(s)
    question = request("question", 6, first=5000)
    s.add(question)
    steps_to_first_token = None
    for step in range(1, 200):
        out = run_step(s)
        assert any(c.request is live and c.is_decode for c in out.chunks)  # the stream never stalls
        assert any(c.request is long for c in out.chunks) or long.decoding  # nor does the long prompt
        if question.output_ids and steps_to_first_token is None:
            steps_to_first_token = step
        if long.output_ids:
            break
    assert steps_to_first_token is not None and steps_to_first_token <= 2, steps_to_first_token
    assert long.output_ids  # it finished too


def test_long_prompts_keep_their_arrival_order_among_themselves() -> None:
    s = make(pages=256, page_size=4, max_step_tokens=16)
    first, second = request("first", 100), request("second", 100, first=500)
    s.add(first)
    s.add(second)
    while not first.output_ids:
        out = run_step(s)
        assert not any(c.request is second for c in out.chunks) or first.num_computed == 100
