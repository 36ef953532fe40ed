"""The packed batch's per-row masks: a grammar's allowed tokens, and the end tokens banned while min_tokens is due."""

from __future__ import annotations

import torch

from engine.core.request import Request
from engine.core.step_planner import sampling_row
from engine.model.batch import allowed_masks
from engine.types import SamplingParams

VOCAB, EOS, STOP = 50, 2, 9


def test_end_tokens_are_banned_row_by_row_until_min_tokens_and_free_requests_need_no_mask() -> None:
    drafting = Request("d", [5, 6, 7], SamplingParams(min_tokens=3, stop_token_ids=(STOP,)))
    drafting.output_ids = [11]  # one made: its rows make the 2nd, 3rd and 4th tokens
    free = Request("f", [5, 6], SamplingParams())
    chunks = [sampling_row(drafting, (12, 13)), sampling_row(free)]
    masks = allowed_masks(chunks, VOCAB, {EOS})
    assert masks.shape == (4, VOCAB)
    assert masks[:, EOS].tolist() == masks[:, STOP].tolist() == [False, False, True, True]
    assert int((~masks).sum()) == 4  # nothing else banned
    assert allowed_masks(chunks[1:], VOCAB, {EOS}) is None
    drafting.output_ids = [11, 12, 13]
    chunks = [sampling_row(drafting, (12, 13)), sampling_row(free)]
    assert allowed_masks(chunks, VOCAB, {EOS}) is None  # min_tokens made: no row is limited


def test_a_grammar_row_keeps_its_mask_and_loses_its_end_tokens_while_min_tokens_is_due() -> None:
    class Grammar:
        def allowed(self) -> torch.Tensor:
            mask = torch.zeros(VOCAB, dtype=torch.bool)
            mask[[EOS, 20, 21]] = True
            return mask

    request = Request("g", [5], SamplingParams(min_tokens=1))
    request.matcher = Grammar()
    (row,) = allowed_masks([sampling_row(request)], VOCAB, {EOS})
    assert row.nonzero().view(-1).tolist() == [20, 21]
