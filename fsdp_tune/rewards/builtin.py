"""The rewards `--reward_funcs` takes by name. fsdp-tune's own need no package beyond the standard library; TRL's
(trl/rewards, as TRL's own `trl grpo` script names them) are imported on the ranks only.

Every reward has TRL's calling convention: `f(prompts, completions, completion_ids, **columns) -> list[float|None]`,
one value per completion (None: this reward does not apply to that row), the dataset's columns as keyword lists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Builtin:
    what: str  # what it rewards, for the plan and `fsdp-tune rules`
    columns: tuple[str, ...] = ()  # the dataset columns it reads (checked before launch)
    conversational: bool | None = None  # True: only for conversational prompts (it reads completion[0]["content"])
    package: str | None = None  # a package it needs beyond fsdp-tune's (checked on the launcher, by name)
    trl: str | None = None  # TRL's name in trl.rewards; None: fsdp-tune's own (this module's function)


BUILTINS: dict[str, Builtin] = {
    "length_reward": Builtin("shorter completions: 1 - tokens / max_completion_length"),
    "exact_match_reward": Builtin(
        "1 when the completion is the row's `answer` (whitespace stripped), else 0", ("answer",)
    ),
    "contains_answer_reward": Builtin("1 when the completion contains the row's `answer`, else 0", ("answer",)),
    "think_format_reward": Builtin(
        "1 when the completion's reasoning is enclosed in <think>...</think>, else 0 (TRL's)",
        conversational=True,
        trl="think_format_reward",
    ),
    "accuracy_reward": Builtin(
        "math answers checked against the row's `solution` with math_verify (TRL's)",
        ("solution",),
        conversational=True,
        package="math_verify",
        trl="accuracy_reward",
    ),
    "reasoning_accuracy_reward": Builtin(
        "as accuracy_reward, on what follows the reasoning (TRL's)",
        ("solution",),
        conversational=True,
        package="math_verify",
        trl="reasoning_accuracy_reward",
    ),
    "get_soft_overlong_punishment": Builtin(
        "DAPO's soft penalty for completions near max_completion_length (the last fifth of it; TRL's)",
        trl="get_soft_overlong_punishment",
    ),
    "get_repetition_penalty_reward": Builtin(
        "a penalty for repeated token 3-grams, down to -1 (TRL's)", trl="get_repetition_penalty_reward"
    ),
}


def text_of(completion) -> str:
    """A completion's text: the string itself, or a conversational completion's assistant content."""
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))
    return str(completion)


def length_reward(max_completion_length: int) -> Callable:
    limit = max(int(max_completion_length), 1)

    def length_reward(completion_ids, **kwargs) -> list[float]:
        return [1.0 - min(len(ids), limit) / limit for ids in completion_ids]

    return length_reward


def exact_match_reward(completions, answer, **kwargs) -> list[float | None]:
    return [
        None if a is None else float(text_of(c).strip() == str(a).strip())
        for c, a in zip(completions, answer, strict=True)
    ]


def contains_answer_reward(completions, answer, **kwargs) -> list[float | None]:
    return [
        None if a is None else float(str(a).strip() in text_of(c)) for c, a in zip(completions, answer, strict=True)
    ]


def make(name: str, max_completion_length: int) -> Callable:
    """The callable a built-in name stands for (TRL's imported here: call on the ranks, or in the probe)."""
    row = BUILTINS[name]
    if row.trl is None:
        return length_reward(max_completion_length) if name == "length_reward" else globals()[name]
    import trl.rewards

    found = getattr(trl.rewards, row.trl)
    if name == "get_soft_overlong_punishment":  # TRL's script: 1280 tokens, the last 256 penalised
        return found(max_completion_len=max_completion_length, soft_punish_cache=max(max_completion_length // 5, 1))
    if name == "get_repetition_penalty_reward":
        return found()
    return found
