"""`fsdp-tune rows`' view of a row (tools/rows.py format_rows): the tokens in the loss marked as text where the
console is no terminal, in colour on one, and the data's own escape sequences shown escaped (the console door)."""

from __future__ import annotations

import re

from fsdp_tune.output.console import render
from fsdp_tune.tools.rows import Shown, format_rows

PIECES = [("<|im_start|>user\nHi", False), ("\x1b]0;owned\x07", False), ("<|im_start|>assistant\n", False)]
PIECES += [("Hel", True), ("lo", True), ("<|im_end|>", True), ("\n", False)]


def test_plain_text_brackets_each_run_of_loss_tokens() -> None:
    text = format_rows("data/a.jsonl (messages)", [Shown("data/a.jsonl:1", "", [PIECES], [False])], tty=False)
    assert "([[ ]]: in the loss)" in text.splitlines()[0]
    assert "data/a.jsonl:1: 7 tokens, 3 in the loss\n" in text
    assert text.endswith("<|im_start|>assistant\n[[Hello<|im_end|>]]\n")  # one run, not one bracket a token
    assert "\\x1b]0;owned\\x07" in render(text, tty=False)  # the data's escape: shown, never obeyed


def test_a_terminal_gets_colour_and_skipped_rows_say_why() -> None:
    rows = [Shown("a.jsonl:1", "", [PIECES, PIECES[:4]], [False, True]), Shown("a.jsonl:2", "the prompt fills it")]
    shown = render(format_rows("a.jsonl (messages)", rows, tty=True), tty=True)
    assert "green: in the loss; dimmed: not" in shown and "[[" not in shown
    assert re.search(r"\x1b\[32m(\x1b\[\d+m)*Hello<\|im_end\|>\x1b\[0m", shown) and "\x1b]0;owned" not in shown
    assert "a.jsonl:1: sequence 2 of 2, 4 tokens, 1 in the loss, cut at max_seq_len" in shown
    assert "a.jsonl:2: skipped: the prompt fills it" in shown
