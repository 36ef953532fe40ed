"""The bfloat16 LM head picks what the float32 head picks, on crafted near-ties where bfloat16's rounding reorders
the leaders (it runs only where this CPU computes bfloat16; elsewhere it says so)."""

from __future__ import annotations

import pytest
import torch

from engine.core.request import Request
from engine.core.step_planner import sampling_row
from engine.model import formats
from engine.model.batch import allowed_masks
from engine.model.lm_head import CANDIDATES, TOP_K_MARGIN, LMHead
from engine.model.sampler import Sampler, candidates
from engine.types import SamplingParams

pytestmark = pytest.mark.skipif(
    not formats.usable(formats.BFLOAT16, torch.device("cpu")),
    reason="this CPU (or torch build) has no usable bfloat16 linear: the bfloat16 LM head never runs here",
)

VOCAB = 64
EOS = 63
DECOY = 1.00395  # rounds up to bfloat16's 1.0078: ranks above TRUE_BEST in bfloat16, below it in float32
TRUE_BEST = (1.0038, 0.003)  # 1.0068 in float32; both parts round down, to 1.0 in bfloat16


def crafted_head(decoys: int = CANDIDATES, eos_first: bool = False) -> LMHead:
    """Hidden [1, 1]: `decoys` tokens whose bfloat16 logits beat token `decoys`'s, which is the float32 best; the
    end token above everything when eos_first; the rest far below."""
    weight = torch.full((VOCAB, 2), -1.0)
    weight[:decoys] = torch.tensor([DECOY, 0.0])
    weight[decoys] = torch.tensor(TRUE_BEST)
    if eos_first:
        weight[EOS] = torch.tensor([3.0, 0.0])
    exact = torch.nn.Linear(2, VOCAB, bias=False)
    exact.weight.data.copy_(weight)
    head = LMHead(exact, weight, None, try_fast=False)
    head.use_fast(formats.make_linear(weight, None, formats.BFLOAT16))
    return head


HIDDEN = torch.ones(1, 2)


def test_the_crafted_near_tie_is_one_bfloat16_reorders() -> None:
    head = crafted_head()
    with torch.inference_mode():
        approx, exact = head.fast(HIDDEN), head.exact(HIDDEN)
    assert int(exact.argmax()) == CANDIDATES  # the float32 best ...
    assert sorted(torch.topk(approx, CANDIDATES).indices[0].tolist()) == list(range(CANDIDATES))  # not a leader
    assert float(approx[0, CANDIDATES]) < float(approx[0, 0])


def test_greedy_picks_the_float32_best_even_outside_the_bfloat16_candidates() -> None:
    head = crafted_head()
    with torch.inference_mode():
        logits = head.greedy(HIDDEN.repeat(3, 1))
    assert logits.argmax(-1).tolist() == [CANDIDATES] * 3
    assert float(logits[0, CANDIDATES]) == pytest.approx(TRUE_BEST[0] + TRUE_BEST[1], abs=1e-6)


def test_top_k_gets_the_float32_top_k() -> None:
    head = crafted_head(decoys=TOP_K_MARGIN + 4)  # k = 4 with its margin: the true best is the 37th in bfloat16
    params = SamplingParams(temperature=1.0, top_k=4)
    with torch.inference_mode():
        approx, exact = head.leading(HIDDEN, params.top_k + TOP_K_MARGIN), head.exact(HIDDEN)
    got_ids, got = candidates(approx[0], params)
    want_ids, want = candidates(exact[0], params)
    assert TOP_K_MARGIN + 4 in want_ids.tolist()
    assert torch.equal(got_ids, want_ids) and torch.allclose(got, want, atol=1e-6)


def test_min_tokens_bans_the_end_token_before_the_leaders_are_chosen() -> None:
    """The end token leads, the request must not end yet: the leaders are chosen among the others, so the float32
    best of those is picked (banned after the choice, the pick was among the seven decoys left)."""
    head = crafted_head(eos_first=True)
    request = Request("r", [3, 4, 5], SamplingParams(min_tokens=2, max_tokens=4))
    allowed = allowed_masks([sampling_row(request)], VOCAB, {EOS})
    assert allowed is not None and not allowed[0, EOS] and allowed[0, :EOS].all()
    with torch.inference_mode():
        logits = head.greedy(HIDDEN, allowed)
    assert Sampler(eos_ids={EOS}).sample(logits, [sampling_row(request)], grammar_applied=True) == [[CANDIDATES]]
    request.output_ids = [7, 8]  # min_tokens made: nothing banned, the end token is free to win
    assert allowed_masks([sampling_row(request)], VOCAB, {EOS}) is None
    with torch.inference_mode():
        assert int(head.greedy(HIDDEN).argmax()) == EOS


def test_a_stored_heads_untimed_form_ranks_with_its_module_under_the_bound_read_at_load(monkeypatch) -> None:
    """The fast path's check holds a stored head as its module ranks (not the int8-activations twin a timing may
    pick), with the error bound made from the row norm read at load: the head is not read again for it."""
    from engine.model import lm_head

    module = formats.make_linear(torch.randn(48, 64, generator=torch.Generator().manual_seed(3)), None, formats.INT8)
    head = LMHead.stored(module)
    assert head.fast is module  # a head this small ranks with its module on every machine
    bound = head._norm_error
    twin = lm_head.Int8ActivationsHead(module)
    head.use_int8_activations(twin, lm_head._max_row_norm(module))
    reads = []
    real = lm_head._max_row_norm
    monkeypatch.setattr(lm_head, "_max_row_norm", lambda m: reads.append(m) or real(m))
    with head.untimed():
        assert head.fast is module and head._norm_error == pytest.approx(bound)
    assert reads == [] and head.fast is twin
