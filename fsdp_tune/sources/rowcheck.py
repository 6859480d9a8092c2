"""Rows that cannot be trained on (skipped, counted, reported with file and row) and rows whose turns are out
of order (kept, reported). Pure Python: pre-flight runs it on every local row it reads, rank 0 on every row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fsdp_tune.sources import vision
from fsdp_tune.sources.convert import STANDARD_ROLES, text, to_trl
from fsdp_tune.sources.formats import ALPACA, PROMPT_COMPLETION, REQUIRED, TEXT, Format, decode_json

# code -> what it means, said once per code in reports ("12 rows: <reason>")
SKIPPED = {
    "missing": "a required column is empty",
    "unreadable": "the row cannot be read in this format",
    "empty-text": "empty text",
    "no-turns": "no turns",
    "bad-turn": "a turn is not an object",
    "unknown-role": "a turn's role is not system/user/assistant/tool",
    "empty-answer": "an empty answer",
    "no-answer": "no assistant turn: nothing to train on",
    "mixed-types": "prompt and completion are of different kinds",
    "bad-history": "history is not a list of [prompt, answer] pairs",
    "image-count": "its image placeholders and its images differ in number",
}
PREFLIGHT_REFUSES = ("image-count",)  # skipped on rank 0; refused before launch (preflight/images.py, PF079)
KEPT = {
    "assistant-first": "the conversation starts with the assistant",
    "consecutive-user": "two user turns in a row",
    "consecutive-assistant": "two assistant turns in a row",
    "orphan-tool": "a tool turn that follows no tool call",
    "system-not-first": "a system turn after the first turn",
    "trailing-turns": "turns after the last answer, which are not trained",
    "prompt-ends-with-assistant": "the prompt ends with an assistant turn",
}


@dataclass(frozen=True)
class Problem:
    code: str
    detail: str = ""  # e.g. "turn 3: role 'narrator'"

    @property
    def skips(self) -> bool:
        return self.code in SKIPPED

    @property
    def reason(self) -> str:
        return SKIPPED.get(self.code) or KEPT.get(self.code) or self.code


@dataclass(frozen=True)
class KindProblem:
    """A row of a data kind TRL takes as it stands (preference pairs, prompts) that cannot be used: its code, what
    about it, whether it is skipped; its reason from the kind's REASONS (code -> words). Each kind subclasses it."""

    code: str
    detail: str = ""
    skips: bool = True
    REASONS: ClassVar[Mapping[str, str]] = {}

    @property
    def reason(self) -> str:
        return self.REASONS.get(self.code, self.code)


def check_row(row: Mapping, fmt: Format, roles: Mapping[str, str] | None = None) -> list[Problem]:
    """Problems of one raw row in format `fmt` (an empty list for a good row)."""
    missing = [fmt.columns[f] for f in REQUIRED[fmt.kind] if row.get(fmt.columns[f]) is None]
    if missing and fmt.kind != TEXT:
        return [Problem("missing", ", ".join(missing))]
    try:
        converted = to_trl(row, fmt, roles)
    except (TypeError, AttributeError, KeyError, ValueError) as e:
        return [Problem("unreadable", f"{type(e).__name__}: {e}")]
    if fmt.kind == TEXT:
        value = row.get(fmt.columns["text"])
        return [] if isinstance(value, str) and value.strip() else [Problem("empty-text")]
    if fmt.kind == PROMPT_COMPLETION:
        return _prompt_completion(converted, fmt)
    images = vision.count_problem(converted)
    if images:
        return [Problem("image-count", images)]
    problems: list[Problem] = []
    if fmt.kind == ALPACA and "history" in fmt.columns:
        history = decode_json(row.get(fmt.columns["history"]))
        if history is not None and not (
            isinstance(history, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in history)
        ):
            problems.append(Problem("bad-history"))
    return problems + check_messages(converted["messages"])


def _prompt_completion(converted: Mapping, fmt: Format) -> list[Problem]:
    prompt, completion = converted["prompt"], converted["completion"]
    if not fmt.conversational:
        if not isinstance(prompt, str) or not isinstance(completion, str):
            return [Problem("mixed-types", "both must be strings in this dataset")]
        return [] if completion.strip() else [Problem("empty-answer", "empty completion")]
    if not isinstance(prompt, list) or not isinstance(completion, list):
        return [Problem("mixed-types", "both must be message lists in this dataset")]
    problems = [p for p in check_messages(prompt + completion, need_answer=False) if p.code != "assistant-first"]
    if not any(m.get("role") == "assistant" and has_answer(m) for m in completion):
        problems.append(Problem("empty-answer", "the completion has no non-empty assistant turn"))
    if prompt and prompt[-1].get("role") == "assistant":
        problems.append(Problem("prompt-ends-with-assistant"))
    return problems


def has_answer(message: Mapping) -> bool:
    content = message.get("content")
    if isinstance(content, list):  # content blocks
        content = "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return bool(text(content).strip()) or bool(message.get("tool_calls"))


def check_messages(messages: Any, need_answer: bool = True) -> list[Problem]:
    """Order: a system turn only first; the user speaks first; a tool turn answers an assistant's tool call;
    every assistant turn says something. Templates that need strict alternation refuse the rest themselves."""
    if not isinstance(messages, list) or not messages:
        return [Problem("no-turns")]
    problems: list[Problem] = []
    prev: Any = None
    answers = 0
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            problems.append(Problem("bad-turn", f"turn {i}"))
            continue
        role = m.get("role")
        if role not in STANDARD_ROLES:
            problems.append(Problem("unknown-role", f"turn {i}: role {role!r} (map it: --dataset_roles {role}=user)"))
        elif role == "system" and i:
            problems.append(Problem("system-not-first", f"turn {i}"))
        elif role == "assistant":
            answers += has_answer(m)
            if not has_answer(m):
                problems.append(Problem("empty-answer", f"turn {i}"))
            if prev in (None, "system"):
                problems.append(Problem("assistant-first", f"turn {i}"))
            elif prev == "assistant":
                problems.append(Problem("consecutive-assistant", f"turn {i}"))
        elif role == "user" and prev == "user":
            problems.append(Problem("consecutive-user", f"turn {i}"))
        elif role == "tool" and not (prev == "tool" or (prev == "assistant" and messages[i - 1].get("tool_calls"))):
            problems.append(Problem("orphan-tool", f"turn {i}"))
        prev = role
    if need_answer and not answers and not any(p.code == "empty-answer" for p in problems):
        problems.append(Problem("no-answer"))
    elif need_answer and answers and prev not in ("assistant", None):
        problems.append(Problem("trailing-turns"))
    return problems


def problems_by_code(rows: list[tuple[str, Any]], fmt: Format, canonical) -> tuple[dict, dict]:
    """(problem code -> the rows with it, problem code -> its first problem), each row read by `canonical(row,
    fmt) -> (row, problem or None)` (a preference or a prompt row's); unreadable rows are the data check's own."""
    by_code: dict[str, list[str]] = {}
    first: dict[str, Any] = {}
    for where, row in rows:
        if not isinstance(row, dict):
            continue
        _, problem = canonical(row, fmt)
        if problem is not None:
            by_code.setdefault(problem.code, []).append(where)
            first.setdefault(problem.code, problem)
    return by_code, first
