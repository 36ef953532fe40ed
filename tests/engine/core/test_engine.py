"""The engine on the tiny random Llama: exact greedy output against transformers, preemption, prefix
caching, chunked prefill, cancellation, failures, limits, and page accounting under random use."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import InvalidRequestError, PromptTooLongError
from engine.types import SamplingParams
from tests.helpers import reference_greedy, run_to_completion

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def prompts(count: int, seed: int = 0, low: int = 3, high: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 370) for _ in range(rng.randint(low, high))] for _ in range(count)]


@pytest.fixture(scope="module")
def references(tiny_loaded):
    cache: dict[tuple, list[int]] = {}

    def get(ids: list[int], n: int = GREEDY.max_tokens) -> list[int]:
        key = (tuple(ids), n)
        if key not in cache:
            cache[key] = reference_greedy(tiny_loaded.model, ids, n, eos=False)
        return cache[key]

    return get


def assert_all_pages_returned(engine) -> None:
    engine.pool.check_invariants()
    assert engine.pool.num_used == 0
    assert not engine.scheduler.running and not engine.scheduler.waiting


def test_greedy_output_equals_transformers(make_engine, references) -> None:
    engine = make_engine()
    batch = prompts(6)
    requests = [engine.add_request(ids, GREEDY) for ids in batch]
    run_to_completion(engine)
    for request, ids in zip(requests, batch, strict=True):
        assert request.output_ids == references(ids)
        assert request.finish_reason == "length"
    assert_all_pages_returned(engine)


def test_same_output_under_preemption(make_engine, references) -> None:
    engine = make_engine(kv_pages=14, page_size=4)  # 56 token slots for 6 requests of up to 52 tokens
    batch = prompts(6, seed=1, high=30)
    requests = [engine.add_request(ids, GREEDY) for ids in batch]
    run_to_completion(engine)
    assert sum(r.preemptions for r in requests) > 0
    for request, ids in zip(requests, batch, strict=True):
        assert request.output_ids == references(ids)
    assert_all_pages_returned(engine)
    assert engine.metrics.snapshot().totals.preemptions == sum(r.preemptions for r in requests)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_shared_prefix_is_computed_once(make_engine, references, prefix_caching: bool) -> None:
    engine = make_engine(prefix_caching=prefix_caching)
    system = prompts(1, seed=2, low=30, high=30)[0]
    first = engine.add_request([*system, 7], GREEDY)
    run_to_completion(engine)  # the prefix is in the cache now (freed pages stay findable)
    later = [engine.add_request([*system, q, q + 1], GREEDY) for q in (11, 12, 13)]
    run_to_completion(engine)
    for request in [first, *later]:
        assert request.output_ids == references(request.prompt_ids)
    expected = 28 if prefix_caching else 0  # 7 full pages of 4 tokens
    assert [r.cached_prompt_tokens for r in later] == [expected] * 3
    assert_all_pages_returned(engine)


def test_chunked_prefill_of_a_long_prompt(make_engine, references) -> None:
    engine = make_engine(max_step_tokens=8, kv_pages=64)
    long_prompt = prompts(1, seed=3, low=45, high=45)[0]
    short = engine.add_request(prompts(1, seed=4)[0], GREEDY)
    engine.step()
    request = engine.add_request(long_prompt, GREEDY)
    steps = engine.metrics.snapshot().totals.steps
    run_to_completion(engine)
    assert request.output_ids == references(long_prompt)
    assert short.output_ids == references(short.prompt_ids)
    records = engine.metrics.snapshot().steps
    assert all(r.prefill_tokens + r.decode_tokens <= 8 for r in records[steps:])


def test_cancel_mid_stream_frees_pages(make_engine) -> None:
    engine = make_engine()
    request = engine.add_request(prompts(1)[0], SamplingParams(max_tokens=50, ignore_eos=True))
    other = engine.add_request(prompts(1, seed=9)[0], SamplingParams(max_tokens=5, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert engine.pool.num_used > 0
    event = engine.abort(request.request_id)
    assert event is not None and event.finished and event.finish_reason == "abort"
    assert engine.abort(request.request_id) is None  # twice is harmless
    assert engine.abort("no-such-request") is None
    run_to_completion(engine)
    assert other.finish_reason == "length"
    assert_all_pages_returned(engine)


def test_a_failing_step_fails_only_its_requests(make_engine, references) -> None:
    engine = make_engine(max_running=1)
    doomed = engine.add_request(prompts(1, seed=5)[0], GREEDY)
    survivor = engine.add_request(prompts(1, seed=6)[0], GREEDY)
    engine.step()
    engine.step()

    def explode(out) -> None:
        engine.fault_injector = None
        raise RuntimeError("injected fault")

    engine.fault_injector = explode
    events = engine.step()
    assert [(e.request_id, e.finish_reason) for e in events] == [(doomed.request_id, "error")]
    assert "injected fault" in events[0].error
    run_to_completion(engine)
    assert survivor.output_ids == references(survivor.prompt_ids)
    assert_all_pages_returned(engine)
    assert engine.metrics.snapshot().totals.requests_failed == 1


def test_stop_token_stop_string_and_max_tokens(make_engine, references) -> None:
    engine = make_engine()
    ids = prompts(1, seed=7)[0]
    expected = references(ids)
    stop_token = expected[3]
    first_stop = expected.index(stop_token)
    by_token = engine.add_request(ids, SamplingParams(max_tokens=12, stop_token_ids=(stop_token,), ignore_eos=True))
    by_length = engine.add_request(ids, SamplingParams(max_tokens=5, ignore_eos=True))
    run_to_completion(engine)
    assert by_token.output_ids == expected[: first_stop + 1] and by_token.finish_reason == "stop"
    assert by_length.output_ids == expected[:5] and by_length.finish_reason == "length"

    text = engine.tokenizer.decode(expected, skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    engine = make_engine()
    request = engine.add_request(ids, SamplingParams(max_tokens=12, stop=(stop,), ignore_eos=True))
    events = run_to_completion(engine)[request.request_id]
    shown = "".join(e.text for e in events)
    assert request.finish_reason == "stop" and stop not in shown and text.startswith(shown)


def test_eos_ends_a_request_unless_ignored(make_engine) -> None:
    engine = make_engine()
    ids = prompts(1, seed=8)[0]
    # make the first greedy token an end-of-sequence token
    probe = engine.add_request(ids, SamplingParams(max_tokens=1, ignore_eos=True))
    run_to_completion(engine)
    engine.eos_ids = {probe.output_ids[0]}
    stops = engine.add_request(ids, SamplingParams(max_tokens=8))
    ignores = engine.add_request(ids, SamplingParams(max_tokens=8, ignore_eos=True))
    run_to_completion(engine)
    assert stops.output_ids == probe.output_ids and stops.finish_reason == "stop"
    assert len(ignores.output_ids) == 8


def test_bad_requests_are_refused_with_a_message(make_engine) -> None:
    engine = make_engine(kv_pages=8, page_size=4)
    with pytest.raises(PromptTooLongError, match="KV cache holds only 32"):
        engine.add_request(list(range(5, 45)), GREEDY)
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.add_request([], GREEDY)
    with pytest.raises(InvalidRequestError, match="temperature"):
        engine.add_request([5, 6], SamplingParams(temperature=-0.5))
    with pytest.raises(InvalidRequestError, match="token ids"):
        engine.add_request([5, 10_000_000], GREEDY)
    engine.context_length = 10
    with pytest.raises(PromptTooLongError, match="context is 10"):
        engine.add_request(list(range(5, 17)), GREEDY)
    assert not engine.has_unfinished


def test_thousands_of_queued_requests_all_finish(make_engine) -> None:
    engine = make_engine(kv_pages=64, page_size=4, max_running=32)
    requests = [engine.add_request([5 + i % 300, 6, 7], SamplingParams(max_tokens=2)) for i in range(1500)]
    run_to_completion(engine)
    assert all(r.is_finished and len(r.output_ids) in (1, 2) for r in requests)
    assert engine.metrics.snapshot().totals.requests_finished == 1500
    assert_all_pages_returned(engine)


def test_seeded_sampling_is_reproducible(make_engine) -> None:
    ids = prompts(1, seed=10)[0]
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, seed=42, ignore_eos=True)
    engine = make_engine()
    alone = engine.add_request(ids, params)
    run_to_completion(engine)
    engine = make_engine()
    noise = [engine.add_request(p, SamplingParams(max_tokens=10, temperature=1.0)) for p in prompts(3, seed=11)]
    batched = engine.add_request(ids, params)
    other_seed = engine.add_request(ids, SamplingParams(max_tokens=10, temperature=1.0, seed=7, ignore_eos=True))
    run_to_completion(engine)
    assert alone.output_ids == batched.output_ids
    assert other_seed.output_ids != batched.output_ids
    assert all(r.is_finished for r in noise)


def test_metrics_record_every_step_and_the_page_map(make_engine) -> None:
    engine = make_engine(speculative=False)  # plain decoding: one decode row per token
    a = engine.add_request(prompts(1, seed=12)[0], SamplingParams(max_tokens=4, ignore_eos=True), tag="chat A")
    b = engine.add_request(prompts(1, seed=13)[0], SamplingParams(max_tokens=4, ignore_eos=True), tag="chat B")
    engine.step()
    page_map = engine.metrics.snapshot().page_map
    owners = {o for page in page_map.owners for o in page}
    assert len(owners) == 2 and set(page_map.tags.values()) == {"chat A", "chat B"}
    assert sum(1 for page in page_map.owners if a.request_id in page) == len(a.page_table)
    run_to_completion(engine)
    snap = engine.metrics.snapshot()
    assert not any(snap.page_map.owners[p] for p in range(engine.pool.num_pages))
    assert sum(r.decode_tokens for r in snap.steps) == 6  # 2 requests x (4 tokens - the first)
    assert sum(r.prefill_tokens for r in snap.steps) == len(a.prompt_ids) + len(b.prompt_ids)
    assert len(snap.tokens) == 8 and snap.totals.generation_tokens == 8
    assert snap.steps[0].prefill_share == 1.0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.sampled_from(["submit", "submit", "cancel", "step", "step", "step"]), st.integers(0, 10_000)),
        min_size=5,
        max_size=60,
    )
)
def test_pages_never_leak_under_random_submit_and_cancel(make_engine, ops) -> None:
    engine = make_engine(kv_pages=12, page_size=4, max_running=4)
    ids: list[str] = []
    for op, n in ops:
        if op == "submit":
            rng = random.Random(n)
            prompt = [rng.randrange(5, 370) for _ in range(rng.randint(1, 20))]
            shared = [9, 9, 9, 9, 8, 8, 8, 8] if n % 2 else []
            ids.append(engine.add_request(shared + prompt, SamplingParams(max_tokens=1 + n % 9)).request_id)
        elif op == "cancel" and ids:
            engine.abort(ids[n % len(ids)])
        else:
            engine.step()
        engine.pool.check_invariants()
        held = {p for r in engine.scheduler.running for p in r.page_table}
        assert engine.pool.num_used == len(held)
        for page in held:
            assert engine.pool.ref_counts[page] == sum(r.page_table.count(page) for r in engine.scheduler.running)
        page_map = engine.page_map()
        computed = sum(r.num_computed for r in engine.scheduler.running)
        assert sum(page_map.filled) == computed - engine.pool.extra_refs * engine.pool.page_size
    run_to_completion(engine)
    assert_all_pages_returned(engine)


def test_the_step_budget_follows_the_device_unless_set(tiny_loaded) -> None:
    from engine.core.config import CPU_STEP_TOKENS, EngineConfig, step_tokens_for
    from engine.core.engine import Engine

    assert Engine(tiny_loaded).config.max_step_tokens == CPU_STEP_TOKENS == step_tokens_for("cpu")
    assert step_tokens_for("cuda:1") == step_tokens_for("mps") > CPU_STEP_TOKENS  # a GPU prefills far faster
    assert Engine(tiny_loaded, EngineConfig(max_step_tokens=64)).config.max_step_tokens == 64


def test_drafts_change_how_many_steps_not_which_tokens(make_engine) -> None:
    """Prompt-lookup drafts, greedy and seeded sampling: the same tokens as without speculation, fewer steps."""
    looped = [7, 8, 9, 10, 11] * 6  # a prompt that repeats itself: drafts are found
    greedy = SamplingParams(max_tokens=20, min_tokens=20)
    seeded = SamplingParams(max_tokens=20, min_tokens=20, temperature=0.8, seed=3)
    for params in (greedy, seeded):
        runs = {}
        for speculative in (False, True):
            engine = make_engine(speculative=speculative)
            request = engine.add_request(looped, params)
            run_to_completion(engine)
            snapshot = engine.metrics.snapshot()
            runs[speculative] = (request.output_ids, snapshot.totals, len(snapshot.steps))
            engine.pool.check_invariants()
            assert engine.pool.num_used == 0
        assert runs[True][0] == runs[False][0]
        assert runs[False][1].draft_tokens == 0 and runs[True][1].draft_tokens >= runs[True][1].accepted_tokens
        assert runs[True][1].generation_tokens == runs[False][1].generation_tokens == 20
    # greedy on a looping prompt: drafts are accepted, and each accepted token saves a step
    engine = make_engine()
    engine.add_request(looped, greedy)
    run_to_completion(engine)
    totals = engine.metrics.snapshot().totals
    assert totals.accepted_tokens > 0
    # the prefill step makes the first token, every later step one plus the drafts it accepted
    assert len(engine.metrics.snapshot().steps) == 20 - totals.accepted_tokens


def test_accepted_drafts_publish_only_their_own_pages(make_engine) -> None:
    """Rejected draft slots are never published to the prefix cache: a later request reusing the pages makes the
    same tokens as one computed from scratch."""
    looped = [7, 8, 9, 10, 11] * 6
    engine = make_engine(page_size=4)
    first = engine.add_request(looped, SamplingParams(max_tokens=24, min_tokens=24))
    run_to_completion(engine)
    follow = looped + first.output_ids[:20]
    again = engine.add_request(follow, SamplingParams(max_tokens=8, min_tokens=8))
    run_to_completion(engine)
    fresh = make_engine(page_size=4, prefix_caching=False, speculative=False)
    alone = fresh.add_request(follow, SamplingParams(max_tokens=8, min_tokens=8))
    run_to_completion(fresh)
    assert again.output_ids == alone.output_ids
    # every full page of the follow-up's prompt but the one holding its last token is found: 12 pages of 4
    assert first.output_ids and engine.metrics.snapshot().totals.accepted_tokens > 0
    assert again.cached_prompt_tokens == (len(follow) - 1) // 4 * 4 == 48


@pytest.mark.parametrize("page_size", [4, 5, 16])
def test_a_follow_up_after_a_speculated_reply_finds_what_it_finds_without_speculation(make_engine, page_size) -> None:
    """Pages filled by accepted draft tokens are published under their own tokens' hashes (they were hashed before
    those tokens were appended, so every later page of the reply chained from a wrong hash)."""
    looped = [7, 8, 9, 10, 11] * 6
    hits, accepted = {}, {}
    for speculative in (False, True):
        engine = make_engine(page_size=page_size, kv_pages=256, speculative=speculative)
        first = engine.add_request(looped, SamplingParams(max_tokens=40, min_tokens=40))
        run_to_completion(engine)
        follow = looped + first.output_ids + [12, 13]  # the next turn: the whole reply, then the user's words
        again = engine.add_request(follow, SamplingParams(max_tokens=2))
        run_to_completion(engine)
        hits[speculative] = again.cached_prompt_tokens
        accepted[speculative] = engine.metrics.snapshot().totals.accepted_tokens
        assert_all_pages_returned(engine)
    assert accepted[True] > 0 and accepted[False] == 0
    # every page the first request filled: all its tokens but the last one made (never run through the model)
    assert hits[True] == hits[False] == (len(looped) + 40 - 1) // page_size * page_size
