"""Rows far longer than max_seq_len, cut before they are rendered and tokenized (#26: one 10,000-turn
conversation kept rank 0 busy for 11 minutes, one 50 MB row took 198 s and 12.7 GiB, to train max_seq_len
tokens of each or none).

A token covers at most `longest` characters (the longest entry of the vocabulary), so C characters of text are
at least C / longest tokens. The first (max_seq_len + MARGIN) x longest characters of a row's text therefore
hold every token that survives the cut at max_seq_len; with TRL's keep_start truncation (the default) the rest
is never rendered: turns past that reach are left out, the turn that crosses it is cut at a word boundary
(template headers and the other turns' text only add tokens, so the bound stays safe). With keep_end the front
of a string row is left out the same way. What cannot be cut (a conversation under keep_end, the packing
strategies that keep every token) is bounded instead: a row holding more than ROW_BOUND sequences of
max_seq_len is skipped as too large, named in the summary.

Templates that drop text they are given (Qwen3 leaves out earlier turns' reasoning) render fewer tokens than
the text holds; for a row beyond the reach the cut may then come before max_seq_len is filled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MARGIN = 64  # tokens kept past max_seq_len: the tokens before the cut are those the whole row gives
ROW_BOUND = 64  # sequences of max_seq_len a row may hold when it cannot be cut
WORD = 256  # characters looked at past the reach for the end of a word


class TooLarge(ValueError):
    """A row past the per-row bound that cannot be cut: skipped, counted, named."""


@dataclass(frozen=True)
class Reach:
    chars: int  # characters of text that hold every token a row keeps (the cut is past them)
    bound: int  # characters a row may hold when it cannot be cut

    @classmethod
    def of(cls, tokenizer, max_seq_len: int) -> Reach:
        longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
        return cls((max_seq_len + MARGIN) * longest, ROW_BOUND * max_seq_len * longest)


def row_chars(row: Mapping[str, Any]) -> int:
    """Characters of text in a converted row (sources/convert.py's representation)."""
    if "text" in row:
        return len(row["text"] or "")
    if "prompt" in row:
        return _chars(row["prompt"]) + _chars(row["completion"])
    return _chars(row.get("messages"))


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_content_chars(m) for m in value if isinstance(m, Mapping))
    return 0


def _content_chars(message: Mapping) -> int:
    content = message.get("content")
    if isinstance(content, list):  # content blocks
        return sum(len(str(b.get("text") or "")) for b in content if isinstance(b, Mapping))
    return len(content) if isinstance(content, str) else 0


def clip(row: Mapping[str, Any], chars: int, keep_end: bool = False) -> dict[str, Any] | None:
    """`row` without the text past its first `chars` characters (its last, with keep_end); None when it cannot
    be cut that way (a conversation under keep_end)."""
    if "text" in row:
        return {**row, "text": _cut(row["text"], chars, keep_end)}
    if "prompt" in row and isinstance(row["prompt"], str):
        prompt, completion = row["prompt"], row["completion"]
        if keep_end:
            completion = _cut(completion, chars, True)
            return {**row, "prompt": _cut(prompt, max(0, chars - len(completion)), True), "completion": completion}
        prompt = _cut(prompt, chars, False)
        return {**row, "prompt": prompt, "completion": _cut(completion, max(0, chars - len(prompt)), False)}
    if keep_end:
        return None
    if "prompt" in row:
        turns = _turns(list(row["prompt"]) + list(row["completion"]), chars)
        n = len(row["prompt"])
        return {**row, "prompt": turns[:n], "completion": turns[n:]}
    return {**row, "messages": _turns(row["messages"], chars)}


def _turns(messages: list, chars: int) -> list:
    """The turns within the first `chars` characters of content, the one crossing it cut."""
    out, used = [], 0
    for m in messages:
        size = _content_chars(m) if isinstance(m, Mapping) else 0
        if used + size > chars:
            if isinstance(m.get("content"), str):
                out.append({**m, "content": _cut(m["content"], chars - used, False)})
            return out
        out.append(m)
        used += size
    return out


def _cut(text: str, chars: int, keep_end: bool) -> str:
    """The first `chars` characters of `text` (its last, with keep_end), at the end of a word when one ends
    within WORD characters past them (a pre-tokenizer splits at spaces: the tokens before the cut stay)."""
    if len(text) <= chars:
        return text
    if keep_end:
        return _cut(text[::-1], chars, False)[::-1]
    end = next((i for i in range(chars, min(len(text), chars + WORD)) if text[i].isspace()), chars)
    return text[:end]
