"""How the replies of a comparison differ: token by token where the tokenizers match, word by word otherwise;
every column against the first (which is marked where any other differs from it)."""

from __future__ import annotations

from dataclasses import dataclass

from widgets.tokens.data import TokenEntry, diff_flags, split_words

BY_TOKEN = "token"
BY_WORD = "word"


@dataclass(frozen=True)
class Comparison:
    mode: str  # BY_TOKEN or BY_WORD
    shown: list[list[TokenEntry]]  # what each column shows (its tokens, or its words)
    marked: list[list[bool]]  # per shown entry: differs
    summaries: list[str]  # one line per column

    @property
    def identical(self) -> bool:
        return not any(any(flags) for flags in self.marked)


def compare_replies(replies: list[list[TokenEntry]], tokenizer_keys: list[str | None]) -> Comparison:
    tokens = all(entry.token_ids for reply in replies for entry in reply)
    same_tokenizer = len(set(tokenizer_keys)) == 1 and tokenizer_keys[0] is not None
    mode = BY_TOKEN if tokens and same_tokenizer else BY_WORD
    if mode == BY_TOKEN:
        shown = [[e for e in reply if e.text or e.token_ids] for reply in replies]
    else:
        shown = [split_words("".join(e.text for e in reply)) for reply in replies]
    units = [[e.unit for e in entries] for entries in shown]
    marked = [[False] * len(entries) for entries in shown]
    unit = "tokens" if mode == BY_TOKEN else "words"
    summaries = [""] * len(shown)
    # an entry is one token, or several that came in one step (accepted drafts): count tokens, as the stats line does
    sizes = [[max(1, len(e.token_ids)) if mode == BY_TOKEN else 1 for e in entries] for entries in shown]

    def count(flags: list[bool], weights: list[int]) -> tuple[int, int]:
        return sum(w for f, w in zip(flags, weights, strict=True) if f), sum(weights)

    for i in range(1, len(shown)):
        reference_flags, flags = diff_flags(units[0], units[i])
        marked[i] = flags
        marked[0] = [a or b for a, b in zip(marked[0], reference_flags, strict=True)]
        differ, total = count(flags, sizes[i])
        summaries[i] = f"{differ} of {total} {unit} differ from the first column"
    why = "" if mode == BY_TOKEN else (" (the tokenizers differ)" if tokens else " (a remote sends text, not tokens)")
    others = "the others" if len(shown) > 2 else "the other"
    differ, total = count(marked[0], sizes[0])
    summaries[0] = f"reference: {differ} of {total} {unit} differ in {others}; compared by {mode}{why}"
    return Comparison(mode, shown, marked, summaries)
