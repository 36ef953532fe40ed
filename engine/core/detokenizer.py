"""Incremental detokenization (never a broken UTF-8 character) and stop strings held back until decided."""

from __future__ import annotations

from collections.abc import Sequence


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Decoding token by token breaks characters that span tokens (byte-level BPE) and loses the spaces some
    tokenizers attach to the following token, so each step decodes a short window of recent tokens and
    emits only what the window adds once it no longer ends in a replacement character."""

    def __init__(self, tokenizer, prompt_ids: Sequence[int], stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.hold_back = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = list(prompt_ids[-6:])  # a little context for tokenizers that need it
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # all output text decoded so far (stop string excluded once found)
        self.emitted = 0  # characters of self.text already handed out
        self.stopped = False

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        """Feed one token; returns the text that can be shown now (maybe empty)."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.text += new_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
        return self._release()

    def _release(self) -> str:
        if self.stop:
            search_from = max(0, self.emitted - self.hold_back)
            positions = [p for p in (self.text.find(s, search_from) for s in self.stop) if p >= 0]
            if positions:
                self.text = self.text[: min(positions)]
                self.stopped = True
                return self.flush()
            safe = len(self.text) - self.hold_back
        else:
            safe = len(self.text)
        if safe <= self.emitted:
            return ""
        delta = self.text[self.emitted : safe]
        self.emitted = safe
        return delta

    def flush(self) -> str:
        """Everything not yet handed out (at the end of a request)."""
        if not self.stopped and self.read_offset < len(self.ids):
            prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
            self.text += self._decode(self.ids[self.prefix_offset :])[len(prefix_text) :]
            self.read_offset = len(self.ids)
        delta = self.text[self.emitted :]
        self.emitted = len(self.text)
        return delta
