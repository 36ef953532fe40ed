"""Sampler filters on known logits, and seeded reproducibility."""

from __future__ import annotations

import math

import pytest
import torch

from engine.core.request import Request
from engine.core.step_planner import sampling_row
from engine.errors import InvalidRequestError
from engine.model.sampler import Sampler, apply_repetition_penalty, filter_logits
from engine.types import SamplingParams

LOGITS = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))


def kept(logits: torch.Tensor) -> list[int]:
    return [i for i, v in enumerate(logits.tolist()) if v != -math.inf]


def test_top_k_keeps_the_k_best() -> None:
    assert kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_k=2))) == [0, 1]


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    assert kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=0.6))) == [0, 1]
    assert kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=0.7))) == [0, 1]
    assert kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=0.71))) == [0, 1, 2]
    assert kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=0.1))) == [0]


def test_min_p_is_relative_to_the_best_token() -> None:
    # threshold 0.35 * 0.5 = 0.175
    assert kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, min_p=0.35))) == [0, 1]


def test_temperature_sharpens_and_flattens() -> None:
    cold = torch.softmax(filter_logits(LOGITS, SamplingParams(temperature=0.5)), -1)
    hot = torch.softmax(filter_logits(LOGITS, SamplingParams(temperature=2.0)), -1)
    assert cold[0] > 0.5 > hot[0]


def test_repetition_penalty_follows_transformers() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0])
    out = apply_repetition_penalty(logits, [0, 1], 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0]
    assert logits.tolist() == [2.0, -2.0, 1.0]  # input untouched


def test_greedy_picks_the_argmax_and_the_penalty_changes_it() -> None:
    sampler = Sampler(seed=0)
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    plain = Request("a", [1], SamplingParams())
    assert sampler.sample(logits, [sampling_row(plain)]) == [[1]]
    penalised = Request("b", [1], SamplingParams(repetition_penalty=4.0))
    assert sampler.sample(logits, [sampling_row(penalised)]) == [[2]]


def test_same_seed_same_tokens_whatever_the_batch() -> None:
    logits = torch.randn(1, 50)
    params = SamplingParams(temperature=1.0, seed=1234)

    def draw(batch_others: int) -> list[int]:
        sampler = Sampler()
        request = Request("r", [1], params)
        others = [Request(f"o{i}", [1], SamplingParams(temperature=1.0)) for i in range(batch_others)]
        tokens = []
        for _ in range(20):
            rows = torch.cat([logits] * (1 + batch_others))
            tokens.append(sampler.sample(rows, [sampling_row(r) for r in (request, *others)])[0][0])
            request.output_ids.append(tokens[-1])  # as the engine does: the next draw is the next position's
        return tokens

    assert draw(0) == draw(3)
    assert len(set(draw(0))) > 1  # it does sample


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (SamplingParams(temperature=-1), "temperature"),
        (SamplingParams(top_p=0.0), "top-p"),
        (SamplingParams(top_p=1.5), "top-p"),
        (SamplingParams(max_tokens=0), "max tokens"),
        (SamplingParams(top_k=-1), "top-k"),
        (SamplingParams(min_p=1.0), "min-p"),
        (SamplingParams(repetition_penalty=0), "repetition penalty"),
        (SamplingParams(stop=("",)), "stop strings"),
    ],
)
def test_invalid_values_are_rejected(params: SamplingParams, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        params.validate()


def test_min_tokens_bans_eos_and_stop_tokens_until_reached() -> None:
    from engine.core.request import Request
    from engine.model.sampler import Sampler

    logits = torch.tensor([[0.0, 5.0, 1.0, 4.0], [0.0, 5.0, 1.0, 4.0]])
    short = Request("a", [0], SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=(3,)))
    done = Request("b", [0], SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=(3,)))
    done.output_ids = [2, 2]
    sampler = Sampler(eos_ids={1})
    # 1 (EOS) and 3 (a stop token) may not end the short reply: the best token left is 2
    assert sampler.sample(logits, [sampling_row(short), sampling_row(done)]) == [[2], [1]]


def test_min_tokens_must_fit_in_max_tokens() -> None:
    with pytest.raises(InvalidRequestError, match="min tokens"):
        SamplingParams(max_tokens=4, min_tokens=5).validate()


def test_a_greedy_draft_is_kept_while_greedy_agrees_then_greedy_corrects_it() -> None:
    # rows: the last known token's logits, then one row per draft token
    logits = torch.tensor([[0.0, 9.0, 0.0, 0.0], [0.0, 0.0, 9.0, 0.0], [9.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 9.0]])
    request = Request("a", [0], SamplingParams(max_tokens=8))
    sampler = Sampler()
    assert sampler.sample(logits, [sampling_row(request, (1, 2, 0))]) == [[1, 2, 0, 3]]  # all kept, and a fourth token
    # the second is wrong: greedy's 2 instead
    assert sampler.sample(logits, [sampling_row(request, (1, 3, 0))]) == [[1, 2]]
    assert sampler.sample(logits[:1], [sampling_row(request)]) == [[1]]


def test_speculative_sampling_keeps_the_output_distribution() -> None:
    """Whatever the draft, the first token follows p: drafts change how many tokens a step makes, not which."""
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]))
    counts = torch.zeros(3)
    sampler = Sampler(seed=0)
    request = Request("a", [0], SamplingParams(temperature=1.0, max_tokens=8))
    trials = 4000
    for _ in range(trials):
        counts[sampler.sample(logits, [sampling_row(request, (1,))])[0][0]] += 1
    assert torch.allclose(counts / trials, torch.tensor([0.6, 0.3, 0.1]), atol=0.03)


def test_top_k_draws_the_token_the_whole_row_would() -> None:
    """With top-k the sampler works on the k candidates only; the same uniforms pick the same tokens as drawing from
    the whole filtered row (ids kept in ascending order)."""
    from engine.model.sampler import _inverse_cdf, candidates

    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(5000, generator=generator) * 3
    for params in (
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95),
        SamplingParams(temperature=1.3, top_k=7, min_p=0.05),
        SamplingParams(temperature=1.0, top_k=100),
    ):
        ids, kept = candidates(logits, params)
        assert ids is not None and ids.tolist() == sorted(ids.tolist()) and len(ids) >= params.top_k
        whole = torch.softmax(filter_logits(logits, params), dim=-1)
        few = torch.softmax(kept, dim=-1)
        for uniform in torch.rand(200, generator=generator).tolist():
            assert int(ids[_inverse_cdf(few, uniform)]) == _inverse_cdf(whole, uniform)


def test_presence_and_frequency_penalties_follow_openais_formula() -> None:
    """logit -= frequency x count + presence x (count > 0), over the reply's tokens only (not the prompt's)."""
    from engine.model.sampler import apply_penalties, penalized_ids

    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    request = Request("a", [0, 0, 0], SamplingParams(presence_penalty=0.5, frequency_penalty=0.25))
    request.output_ids = [3, 3, 1]
    out = apply_penalties(logits, sampling_row(request))
    assert out.tolist() == [1.0, 2.0 - 0.25 - 0.5, 3.0, 4.0 - 0.5 - 0.5]
    assert logits.tolist() == [1.0, 2.0, 3.0, 4.0]  # input untouched
    assert penalized_ids(sampling_row(request)) == [1, 3]
    assert penalized_ids(sampling_row(Request("b", [0], SamplingParams(repetition_penalty=1.1)))) == [0]
    with pytest.raises(InvalidRequestError, match="presence penalty"):
        SamplingParams(presence_penalty=2.5).validate()


def test_a_greedy_request_with_penalties_avoids_its_repeats() -> None:
    sampler = Sampler(seed=0)
    logits = torch.tensor([[1.0, 3.0, 2.9]])
    request = Request("a", [0], SamplingParams(frequency_penalty=0.2))
    assert sampler.sample(logits, [sampling_row(request)]) == [[1]]
    request.output_ids = [1]
    assert sampler.sample(logits, [sampling_row(request)]) == [[2]]  # 3.0 - 0.2 < 2.9
    boosted = Request("b", [0], SamplingParams(presence_penalty=-0.5))
    boosted.output_ids = [0]
    assert sampler.sample(logits, [sampling_row(boosted)]) == [[1]]  # 1.0 + 0.5 still below 3.0
