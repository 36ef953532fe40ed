"""The metadata our header parser hands transformers' GGUF readers is what their own reader returns, and the
tokenizer read through it encodes and templates as transformers' own GGUF tokenizer loading does."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.load.gguf_header import read_header
from engine.load.gguf_metadata import read_config, read_tokenizer, transformers_metadata
from engine.load.model_source import resolve_model_spec

VOCABULARY = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


@pytest.fixture(scope="module")
def files() -> list[Path]:
    """The embedded model's file: a real vocabulary of 49k tokens, its merges and a chat template."""
    embedded = resolve_model_spec(None).path
    assert embedded is not None
    return [embedded]


@pytest.mark.parametrize("string_arrays", [(), VOCABULARY])
def test_our_metadata_is_what_transformers_reader_returns(files: list[Path], string_arrays) -> None:
    from transformers.integrations.gguf.reader import read_gguf_metadata

    for path in files:
        theirs = read_gguf_metadata(str(path), string_arrays)
        ours = transformers_metadata(str(path), string_arrays)
        assert ours == theirs
        assert {k: type(v) for k, v in ours[0].items()} == {k: type(v) for k, v in theirs[0].items()}


def test_the_tokenizer_read_through_our_header_is_transformers_own(files: list[Path]) -> None:
    from transformers import AutoTokenizer
    from transformers.integrations import gguf as integration
    from transformers.integrations.gguf import reader

    original = reader.read_gguf_metadata
    messages = [{"role": "user", "content": "Héllo, wörld! 1234 <tags> and\ttabs\n"}]
    for path in files:
        ours = read_tokenizer(read_header(path))
        assert reader.read_gguf_metadata is original and integration.read_gguf_metadata is original  # put back
        theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        text = messages[0]["content"]
        assert ours(text)["input_ids"] == theirs(text)["input_ids"]
        assert ours.get_vocab() == theirs.get_vocab()
        if theirs.chat_template:
            assert ours.apply_chat_template(messages, tokenize=False) == theirs.apply_chat_template(
                messages, tokenize=False
            )
        assert read_config(read_header(path)).vocab_size >= len(theirs)
