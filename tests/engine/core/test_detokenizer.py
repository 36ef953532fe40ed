"""Incremental detokenization: no broken characters, deltas add up, stop strings cut and held back."""

from __future__ import annotations

import pytest

from engine.core.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


TEXTS = ["héllo wörld 😀 and 中文 text", "plain ascii, with spaces   and\nnewlines", "🚀🚀 emoji only 👩‍👩‍👧"]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_never_break_a_character_and_add_up(tokenizer, text: str) -> None:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tokenizer, [1, 2, 3])
    deltas = [detok.add(t) for t in ids]
    deltas.append(detok.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)


def test_stop_string_is_cut_and_never_shown(tokenizer) -> None:
    ids = tokenizer("the answer is 42. STOP here comes more", add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tokenizer, [], stop=["STOP"])
    shown = ""
    for t in ids:
        shown += detok.add(t)
        assert "STO" not in shown  # the partial match is held back while undecided
        if detok.stopped:
            break
    shown += detok.flush()
    assert detok.stopped
    assert shown == "the answer is 42. "


def test_held_back_text_is_released_at_the_end(tokenizer) -> None:
    ids = tokenizer("ends with ST", add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tokenizer, [], stop=["STOP"])
    shown = "".join(detok.add(t) for t in ids) + detok.flush()
    assert shown == "ends with ST" and not detok.stopped


def test_special_tokens_are_not_shown(tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer, [])
    ids = [*tokenizer("hi", add_special_tokens=False).input_ids, tokenizer.eos_token_id]
    assert "".join(detok.add(t) for t in ids) + detok.flush() == "hi"
