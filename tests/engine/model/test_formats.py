"""Weight formats: the fastest per batch size, measured; bfloat16 copies only where the user left the dtype free."""

from __future__ import annotations

import pytest
import torch

from engine.model import formats
from engine.model.formats import BFLOAT16, FLOAT32, FormatChoice, FormattedLinear, measure
from engine.types import SamplingParams


class FakeClock:
    """formats.measure's clock, advanced by the passes it times: the timings are what each pass says it costs, not
    what a busy machine makes of a sleep."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def costing(self, seconds):
        """A pass that takes `seconds(rows)` on this clock."""

        def run(rows: int) -> None:
            self.now += seconds(rows)

        return run


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(formats, "time", fake)
    return fake


def test_each_bucket_takes_the_format_measured_fastest(clock: FakeClock) -> None:
    def slow_when(big: bool):
        return clock.costing(lambda rows: 0.004 if (rows > 4) == big else 0.0005)

    choice = measure({FLOAT32: slow_when(False), BFLOAT16: slow_when(True)}, buckets=(1, 4, 16))
    assert choice.chosen == {1: BFLOAT16, 4: BFLOAT16, 16: FLOAT32}
    assert choice.format_for(1) == BFLOAT16 and choice.format_for(3) == BFLOAT16
    assert choice.format_for(5) == FLOAT32 and choice.format_for(512) == FLOAT32  # past the last: the last
    assert "1 row: bfloat16" in choice.describe() and "measured ms per pass" in choice.describe()


def test_a_formatted_linear_computes_the_float32_linear_in_bfloat16() -> None:
    if not formats.bfloat16_usable(torch.device("cpu")):
        pytest.skip("no oneDNN bfloat16 here")
    linear = torch.nn.Linear(64, 32)
    formatted = FormattedLinear(linear.weight, linear.bias, BFLOAT16)
    x = torch.randn(5, 64)
    with torch.inference_mode():
        out, expected = formatted(x), linear(x)
    assert out.dtype == torch.float32 and out.shape == (5, 32)
    assert torch.allclose(out, expected, atol=0.05, rtol=0.02)


def test_only_an_automatic_dtype_lets_the_engine_pick_formats(tiny_model_dir) -> None:
    from engine.core.engine import Engine, weight_formats
    from engine.load.loader import load_model
    from engine.load.options import LoadOptions

    pinned = load_model(str(tiny_model_dir), LoadOptions(dtype="float32"))
    assert weight_formats(pinned) == ()
    auto = load_model(str(tiny_model_dir))
    if not formats.bfloat16_usable(torch.device("cpu")):
        assert weight_formats(auto) == ()
        return
    assert weight_formats(auto) == (FLOAT32, BFLOAT16)
    engine = Engine(auto)
    choice: FormatChoice = engine.runner.fast.choice
    assert set(choice.timings_ms) == {FLOAT32, BFLOAT16} and set(choice.chosen) == set(formats.BUCKETS)
    assert engine.runtime_record()["weight_formats"] == choice.describe()
    from engine.types import SamplingParams

    engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, min_tokens=3))
    while engine.has_unfinished:
        engine.step()
    steps = engine.metrics.snapshot().steps
    assert {s.weight_format for s in steps} <= choice.formats and all(s.weight_format for s in steps)


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_asking_for_int8_or_int4_holds_the_linears_in_it(tiny_model_dir, quantization) -> None:
    """The loader quantizes each linear in turn (no float32 copy stays beside them); the engine runs them."""
    from engine.core.engine import Engine, weight_formats
    from engine.load.loader import load_model
    from engine.load.options import LoadOptions
    from engine.model.quantized import weight_format
    from engine.types import SamplingParams

    if not formats.usable(quantization, torch.device("cpu")):
        pytest.skip(f"torch's {quantization} CPU kernel is missing here")
    loaded = load_model(str(tiny_model_dir), LoadOptions(quantization=quantization))
    layer = loaded.model.model.layers[0]
    assert weight_format(layer.mlp.down_proj) == weight_format(layer.self_attn.q_proj) == quantization
    assert loaded.as_stored and weight_formats(loaded) == ()
    engine = Engine(loaded)
    request = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, min_tokens=4))
    while engine.has_unfinished:
        engine.step()
    assert len(request.output_ids) == 4


def test_quantized_linears_stay_close_to_the_float32_linear() -> None:
    from engine.model.quantized import Int4Linear, Int8Linear

    linear = torch.nn.Linear(128, 64)
    x = torch.randn(4, 128)
    with torch.inference_mode():
        expected = linear(x)
        for module, bound in (
            (Int8Linear(linear.weight, linear.bias), 0.02),
            (Int4Linear(linear.weight, linear.bias), 0.25),
        ):
            error = (module(x) - expected).abs().max() / expected.abs().max()
            assert error < bound, type(module).__name__


def test_a_measured_choice_is_remembered_for_this_machine_and_shape(clock: FakeClock) -> None:
    calls: list[str] = []

    def timed(name: str, delay: float):
        cost = clock.costing(lambda rows: delay)
        return lambda rows: (calls.append(name), cost(rows))

    passes = {FLOAT32: timed(FLOAT32, 0.002), BFLOAT16: timed(BFLOAT16, 0.0002)}
    key = formats.machine_key("test shape", 1, 2, 3)
    first = measure(passes, buckets=(1, 4), key=key)
    assert first.chosen == {1: BFLOAT16, 4: BFLOAT16} and calls
    calls.clear()
    again = measure(passes, buckets=(1, 4), key=key)
    assert again.chosen == first.chosen and calls == []  # not measured again
    assert measure(passes, buckets=(1, 4, 16), key=key).chosen[16] == BFLOAT16  # other buckets: measured anew


def test_a_choice_measured_on_a_busy_machine_is_used_but_measured_again_next_start(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    slow_bfloat16 = {"on": True}  # the busy spell makes bfloat16 look slow

    def timed(name: str):
        cost = clock.costing(lambda rows: 0.002 if (name == BFLOAT16) == slow_bfloat16["on"] else 0.001)
        return lambda rows: (calls.append(name), cost(rows))

    passes = {FLOAT32: timed(FLOAT32), BFLOAT16: timed(BFLOAT16)}
    key = formats.machine_key("busy shape", 1)
    monkeypatch.setattr(formats.contention, "others_share", lambda *_: 0.8)  # others held 80 % of the CPUs
    busy = measure(passes, buckets=(1,), key=key)
    assert busy.chosen == {1: FLOAT32}  # used for this start
    assert formats.remembered(key, [FLOAT32, BFLOAT16], buckets=(1,)) is None  # but not as settled
    monkeypatch.setattr(formats.contention, "others_share", lambda *_: 0.02)
    slow_bfloat16["on"] = False
    calls.clear()
    quiet = measure(passes, buckets=(1,), key=key)
    assert calls and quiet.chosen == {1: BFLOAT16}  # measured again, on a quiet machine
    calls.clear()
    assert measure(passes, buckets=(1,), key=key).chosen == {1: BFLOAT16} and calls == []  # now kept


@pytest.mark.parametrize("entry", [{"settled": True, "measured_at": 0.0}, {}], ids=["expired", "older-version"])
def test_an_expired_or_unqualified_remembered_choice_is_measured_again(clock: FakeClock, entry: dict) -> None:
    import json

    key = formats.machine_key("old shape", 2)
    formats._store().parent.mkdir(parents=True, exist_ok=True)
    store = json.loads(formats._store().read_text()) if formats._store().exists() else {}
    store[key] = {"chosen": {"1": FLOAT32}, "timings": {}, "measured_on": "", **entry}
    formats._store().write_text(json.dumps(store))
    calls: list[str] = []
    cost = clock.costing(lambda rows: 0.001)
    passes = {FLOAT32: lambda rows: (calls.append(FLOAT32), cost(rows)), BFLOAT16: lambda rows: cost(rows) or None}
    assert formats.remembered(key, [FLOAT32, BFLOAT16], buckets=(1,)) is None
    measure(passes, buckets=(1,), key=key)
    assert calls  # measured, not taken from the stale entry


def test_the_share_of_the_cpus_other_processes_took_comes_from_proc_stat() -> None:
    from engine.model.contention import Snapshot, others_share, snapshot

    ticks = __import__("os").sysconf("SC_CLK_TCK")
    start = Snapshot(wall=10.0, busy_ticks=1000, cpus=2, own_seconds=5.0)
    # 1 s on 2 CPUs: 1.5 CPU-seconds busy in all, 0.5 of them ours -> others took half the machine
    end = Snapshot(wall=11.0, busy_ticks=1000 + int(1.5 * ticks), cpus=2, own_seconds=5.5)
    assert others_share(start, end) == pytest.approx(0.5, abs=0.02)
    assert others_share(start, Snapshot(10.01, 1000, 2, 5.0)) is None  # too short a window to tell
    assert others_share(None, end) is None
    now = snapshot()
    if now is not None:  # Linux: the real counters read
        assert now.cpus >= 1 and now.busy_ticks > 0


def _greedy_head(seed: int):
    """An LM head of random weights whose greedy path is bfloat16 where this CPU can (as if measured faster)."""
    from engine.model.lm_head import LMHead

    torch.manual_seed(seed)
    weight = torch.randn(1000, 64) * 0.1
    head = LMHead(torch.nn.Linear(64, 1000, bias=False), weight, None, try_fast=False)
    head.exact.weight.data.copy_(weight)
    if formats.usable(BFLOAT16, torch.device("cpu")):
        head.use_fast(formats.make_linear(weight, None, BFLOAT16))
    return head


def test_the_greedy_lm_head_picks_what_the_float32_head_picks() -> None:
    head = _greedy_head(seed=0)
    hidden = torch.randn(32, 64)
    with torch.inference_mode():
        exact, greedy = head.exact(hidden), head.greedy(hidden)
    assert torch.equal(exact.argmax(-1), greedy.argmax(-1))
    top = exact.topk(3).indices  # the leaders are exact (near the 8th, bfloat16 may pick another candidate)
    assert torch.allclose(greedy.gather(-1, top), exact.gather(-1, top), atol=1e-5)
    # a step whose rows all prefill a long prompt's first chunks samples nothing: no rows, no logits (was a crash)
    with torch.inference_mode():
        assert head.greedy(hidden[:0]).shape == (0, 1000)


def test_the_greedy_lm_head_picks_the_likeliest_allowed_token_when_a_grammar_masks_the_rest() -> None:
    head = _greedy_head(seed=1)
    hidden = torch.randn(8, 64)
    allowed = torch.zeros(8, 1000, dtype=torch.bool)
    allowed[:, 500:503] = True  # three tokens, far from the unmasked leaders: fewer than the exact candidates
    allowed[0] = True  # a free row beside them
    with torch.inference_mode():
        exact = head.exact(hidden)
        greedy = head.greedy(hidden, allowed)
    expected = exact.masked_fill(~allowed, float("-inf"))
    assert torch.equal(greedy.argmax(-1), expected.argmax(-1))
    assert torch.isinf(greedy[1:, :500]).all() and torch.isfinite(greedy[1:, 500:503]).all()
    assert torch.allclose(greedy[1:, 500:503], exact[1:, 500:503], atol=1e-5)  # the allowed ones are exact


def test_top_k_sampling_gets_its_candidates_and_penalised_tokens_exact() -> None:
    """The LM head's leading path for top-k sampling: the k best (and a margin) and each row's penalised tokens are
    float32's, so the sampler's candidates and their probabilities are what the float32 head gives."""
    from engine.model.lm_head import TOP_K_MARGIN
    from engine.model.sampler import apply_repetition_penalty, candidates
    from engine.types import SamplingParams

    head = _greedy_head(seed=2)
    hidden = torch.randn(4, 64)
    seen = [[5, 900, 17], [], [1, 2, 3], [999]]
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.95, repetition_penalty=1.3)
    with torch.inference_mode():
        exact = head.exact(hidden)
        approx = head.leading(hidden, params.top_k + TOP_K_MARGIN, None, seen)
    for row, ids in enumerate(seen):
        if ids:
            assert torch.allclose(approx[row, ids], exact[row, ids], atol=1e-5)
        want_ids, want = candidates(apply_repetition_penalty(exact[row], ids, params.repetition_penalty), params)
        got_ids, got = candidates(apply_repetition_penalty(approx[row], ids, params.repetition_penalty), params)
        assert torch.equal(got_ids, want_ids)
        assert torch.allclose(torch.softmax(got, -1), torch.softmax(want, -1), atol=1e-5)


def test_which_steps_pick_among_leading_candidates() -> None:
    from engine.core.request import Request
    from engine.core.step_planner import sampling_row
    from engine.model.batch import _leading, _penalized
    from engine.model.lm_head import CANDIDATES, TOP_K_MARGIN

    def chunks(*params: SamplingParams, replied: tuple[int, ...] = ()) -> list:
        requests = [Request(f"r{i}", [3, 4, 3], p) for i, p in enumerate(params)]
        requests[-1].output_ids = list(replied)
        return [sampling_row(r) for r in requests]

    greedy, top_k = SamplingParams(), SamplingParams(temperature=0.8, top_k=40)
    assert _leading(chunks(greedy)) == CANDIDATES
    assert _leading(chunks(greedy, top_k)) == 40 + TOP_K_MARGIN
    assert _leading(chunks(SamplingParams(repetition_penalty=1.2))) == CANDIDATES + TOP_K_MARGIN
    for needs_every_logit in (
        SamplingParams(temperature=0.8),  # no top-k: the whole vocabulary may be drawn
        SamplingParams(temperature=0.8, top_k=1000),
        SamplingParams(logprobs=2),
        SamplingParams(logit_bias=((7, 5.0),)),
    ):
        assert _leading(chunks(greedy, needs_every_logit)) is None
    assert _penalized(chunks(greedy, top_k)) is None
    assert _penalized(chunks(greedy, SamplingParams(repetition_penalty=1.2))) == [[], [3, 4]]
    # OpenAI's penalties: the reply's own tokens join the exact candidates, and a greedy row gets the margin
    presence = SamplingParams(presence_penalty=0.5)
    assert _leading(chunks(presence)) == CANDIDATES + TOP_K_MARGIN
    replied = chunks(greedy, presence, replied=(9, 7, 9))
    assert _penalized(replied) == [[], [7, 9]]


@pytest.mark.parametrize("fmt", ["int8", "int4", "bfloat16"])
def test_a_head_held_as_stored_picks_the_exact_greedy_token_of_its_weights(fmt) -> None:
    """The quantized head's own kernel (bfloat16 rows in, bfloat16 logits out) ranks near-ties differently from
    float32 over its weights; greedy picks float32's, and every logit is exact when all are asked for."""
    from engine.model.lm_head import LMHead
    from engine.model.quantized import make_weight_module

    if fmt != "bfloat16" and not formats.usable(fmt, torch.device("cpu")):
        pytest.skip(f"torch's {fmt} CPU kernel is missing here")
    torch.manual_seed(0)
    module = make_weight_module(torch.randn(2000, 64) * 0.05, None, fmt)
    head = LMHead.stored(module)
    hidden = torch.randn(64, 64) * 4
    with torch.inference_mode():
        exact = hidden @ module.dequantize().t()
        assert torch.allclose(head.exact(hidden), exact, atol=1e-4, rtol=1e-5)
        greedy = head.greedy(hidden)
        assert torch.equal(greedy.argmax(-1), exact.argmax(-1))
        picked = greedy.gather(-1, exact.argmax(-1, keepdim=True))
        assert torch.allclose(picked, exact.max(-1, keepdim=True).values, atol=1e-4)


def test_checking_that_bfloat16_runs_here_does_not_measure_the_bfloat16_layouts(monkeypatch) -> None:
    # a quantized model asks whether bfloat16 products run here before it finds that no copy would fit: that question
    # must not cost the blocks' once-a-machine measurement (2.3 s of a first start)
    from engine.model import bf16_blocks

    asked = []
    monkeypatch.setattr(bf16_blocks, "use_blocks", lambda progress=None: asked.append(1) or False)
    runs_here = formats.usable(BFLOAT16, torch.device("cpu"))
    assert asked == []
    if runs_here:
        formats.make_linear(torch.randn(32, 64), None, BFLOAT16)  # a copy that is made does ask
        assert asked == [1]
