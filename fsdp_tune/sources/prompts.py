"""Prompt-only data for online RL (a generating method: --method grpo, rloo), told apart by its columns and turned into
TRL's own row (pure Python: the launcher detects and checks local files with it, rank 0 converts every row with it).

    prompt_only  a `prompt` column: a string (plain) or a list of {role, content} turns ending with the user's
                 (conversational, TRL applies the chat template with the generation prompt); every other column
                 travels with the row and reaches the reward functions as a keyword argument of the same name

GRPOTrainer generates the completions itself, so rows that already hold answers are SFT or preference data: a
`prompt` beside them is still a prompt (prompt/chosen/rejected, prompt/completion: the answers reach the rewards as
columns), a conversation without one is refused with the way to use it (preflight/prompts.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsdp_tune.sources.formats import PROMPT_KINDS, Format, FormatError, decode_json
from fsdp_tune.sources.rowcheck import KindProblem

(PROMPT_ONLY,) = PROMPT_KINDS
# columns TRL does not pass to the reward functions under their own name (grpo_trainer.py _calculate_rewards: the
# generated completion goes by these names), with the name fsdp-tune gives the dataset's column instead
RENAMED = {"completion": "reference_completion", "completion_ids": "reference_completion_ids"}

SKIPPED = {
    "empty-prompt": "an empty prompt",
    "not-turns": "the prompt is neither a string nor a list of {role, content} turns",
    "ends-with-answer": "the conversation ends with an assistant turn: the completion would be a second answer",
    "mixed-types": "the prompt is text here and a conversation elsewhere",
}


class Problem(KindProblem):
    """A row that cannot be trained on (sources/rowcheck.py KindProblem: datacheck reports it as SFT's)."""

    REASONS = SKIPPED


def _turns(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def detect_prompts(
    columns, rows: list[Mapping], *, forced: str | None = None, column_map: Mapping[str, str] | None = None
) -> Format:
    """The prompt column of a dataset (--dataset_columns prompt=COLUMN names another) and whether it holds
    conversations; FormatError when there is none."""
    columns, column_map = set(columns), dict(column_map or {})
    if forced not in (None, "auto", PROMPT_ONLY):
        raise FormatError(
            f"format {forced} is not prompts: a generating method (online RL) generates the answers and scores them",
            "--dataset_format prompt_only (or auto)",
        )
    prompt = column_map.get("prompt", "prompt")
    if prompt not in columns:
        raise FormatError(
            f"no {prompt!r} column (columns: {', '.join(sorted(columns)) or 'none'}): a generating method trains on "
            "prompts, {prompt: TEXT} or {prompt: [{role: user, content: ...}]}, and any columns the rewards read",
            "name the prompt column: --dataset_columns prompt=COLUMN",
        )
    first = next((v for r in rows if (v := decode_json(r.get(prompt))) not in (None, "", [])), None)
    extra = sorted(columns - {prompt})
    notes = tuple(
        f"column {c!r} reaches the rewards as {RENAMED[c]!r} (TRL's name for the generated one)"
        for c in extra
        if c in RENAMED
    )
    return Format(PROMPT_ONLY, {"prompt": prompt}, conversational=_turns(first), notes=notes)


def canonical(row: Mapping, fmt: Format) -> tuple[dict | None, Problem | None]:
    """TRL's row, {"prompt": ..., every other column}, or why the row cannot be used."""
    column = fmt.columns["prompt"]
    prompt = decode_json(row.get(column))
    if prompt in (None, "", []) or (isinstance(prompt, str) and not prompt.strip()):
        return None, Problem("empty-prompt")
    if fmt.conversational != _turns(prompt):
        return None, Problem("mixed-types" if isinstance(prompt, (str, list)) else "not-turns")
    if not fmt.conversational and not isinstance(prompt, str):
        return None, Problem("not-turns", type(prompt).__name__)
    if fmt.conversational and prompt[-1].get("role") == "assistant":
        return None, Problem("ends-with-answer")
    out = {"prompt": prompt}
    for key, value in row.items():
        if key != column:
            out[RENAMED.get(key, key)] = value
    return out, None


def columns_after(fmt: Format, columns) -> list[str]:
    """The columns the reward functions receive (besides prompts, completions and completion_ids)."""
    prompt = fmt.columns["prompt"]
    return sorted(RENAMED.get(c, c) for c in columns if c != prompt)
