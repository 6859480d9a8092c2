"""Preference data, told apart by its columns and a look at the values, and turned into TRL's own columns (pure
Python: the launcher detects and checks local files with it, rank 0 converts every row with it).

    preference           prompt, chosen, rejected: TRL's explicit-prompt pairs (strings, or message lists with the
                         answers as assistant turns)
    preference_implicit  chosen, rejected: whole conversations or texts that share their start (Anthropic HH;
                         UltraFeedback's chosen/rejected message lists, its `prompt` string left aside); the prompt
                         is their common start, cut at a turn (conversations) or a word (text)
    unpaired             prompt, completion, label: KTO's rows (label true for a desirable answer)
    ranked               prompt and two answers with what says which is better: response_0/response_1 with
                         better_response_id (PKU-SafeRLHF); response_a/response_b with winner (model_a/model_b, a/b;
                         ties skipped) or with score_a/score_b (the higher wins; equal scores skipped)

score_chosen/score_rejected beside a pair (UltraFeedback) skip the pairs they rank equal; a `margin` column reaches
RewardTrainer (its loss subtracts it). The canonical rows: {prompt, chosen, rejected} for DPO and reward,
{prompt, completion, label} for KTO (pairs become two rows: worker/data/preference.py shuffles them with the seed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsdp_tune.sources.formats import (
    PREFERENCE_FIELDS,
    PREFERENCE_KINDS,
    Format,
    FormatError,
    column_example,
    decode_json,
)
from fsdp_tune.sources.rowcheck import KindProblem

PREFERENCE, IMPLICIT, UNPAIRED, RANKED = PREFERENCE_KINDS
PAIRED = (PREFERENCE, IMPLICIT, RANKED)
# (first answer, second answer, the suffix each goes by in a winner value or a score column); answers under
# other names (--dataset_columns answer_a=...,answer_b=...) go by a and b
ANSWER_PAIRS = (("response_a", "response_b", "a", "b"), ("response_0", "response_1", "0", "1"))
TIES = ("tie", "tie (bothbad)", "both", "neither", "none")
TRUE_LABELS = {"true", "1", "yes", "desirable", "good"}
FALSE_LABELS = {"false", "0", "no", "undesirable", "bad"}

SKIPPED = {
    "missing": "a required column is empty",
    "empty-chosen": "an empty chosen answer",
    "empty-rejected": "an empty rejected answer",
    "empty-completion": "an empty completion",
    "identical": "chosen and rejected are the same: nothing to prefer",
    "no-prompt": "chosen and rejected share no start to take as the prompt",
    "mixed-types": "prompt and answers are of different kinds (text and message lists)",
    "not-an-answer": "an answer does not start with an assistant turn",
    "tie": "the two answers are ranked equal",
    "no-preference": "the preference column names neither answer",
    "bad-label": "label is not true/false",
}


class Problem(KindProblem):
    """A row that cannot be trained on (sources/rowcheck.py KindProblem: datacheck reports it as SFT's)."""

    REASONS = SKIPPED


def _value(rows: list[Mapping], column: str) -> Any:
    for row in rows:
        value = decode_json(row.get(column))
        if value not in (None, "", []):
            return value
    return None


def suffixes(columns: Mapping[str, str]) -> tuple[str, str]:
    """What a winner value or a score column calls the two answers of a ranked format (0/1 for response_0/1)."""
    for a, b, sa, sb in ANSWER_PAIRS:
        if (columns.get("answer_a"), columns.get("answer_b")) == (a, b):
            return sa, sb
    return "a", "b"


def _turns(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def _col(columns: set[str], column_map: Mapping[str, str], field: str, name: str | None = None) -> str | None:
    wanted = column_map.get(field, name or field)
    return wanted if wanted in columns else None


def _ranked(columns: set[str], column_map: Mapping[str, str]) -> dict[str, str] | None:
    for a, b, sa, sb in ANSWER_PAIRS:
        found = {
            "answer_a": _col(columns, column_map, "answer_a", a),
            "answer_b": _col(columns, column_map, "answer_b", b),
        }
        if None in found.values():
            continue
        winner = _col(columns, column_map, "winner") or next(
            (c for c in ("winner", "better_response_id") if c in columns), None
        )
        if winner:
            return {**found, "winner": winner}
        if f"score_{sa}" in columns and f"score_{sb}" in columns:
            return {**found, "score_a": f"score_{sa}", "score_b": f"score_{sb}"}
    return None


def detect_preference(
    columns, rows: list[Mapping], *, forced: str | None = None, column_map: Mapping[str, str] | None = None
) -> Format:
    """The preference format of a dataset from its column names and a few rows; `forced` (--dataset_format) skips
    the guess but still checks the columns; `column_map` (--dataset_columns field=column) renames."""
    ordered, columns, column_map = list(dict.fromkeys(columns)), set(columns), dict(column_map or {})
    forced = None if forced in (None, "auto") else forced
    if forced and forced not in PREFERENCE_KINDS:
        raise FormatError(
            f"{forced} is supervised fine-tuning data, not preference data",
            f"--dataset_format one of {', '.join(PREFERENCE_KINDS)} (or auto), or --method sft",
        )
    prompt, chosen, rejected = (_col(columns, column_map, f) for f in ("prompt", "chosen", "rejected"))
    extras = {f: c for f in ("score_chosen", "score_rejected", "margin") if (c := _col(columns, column_map, f))}
    if chosen and rejected and forced in (None, PREFERENCE, IMPLICIT):
        return _pairs(prompt, chosen, rejected, extras, rows, forced)
    completion, label = _col(columns, column_map, "completion"), _col(columns, column_map, "label")
    if prompt and completion and label and forced in (None, UNPAIRED):
        conversational = _turns(_value(rows, prompt)) and _turns(_value(rows, completion))
        found = {"prompt": prompt, "completion": completion, "label": label}
        return Format(UNPAIRED, found, conversational=conversational)
    ranked = _ranked(columns, column_map)
    if prompt and ranked and forced in (None, RANKED):
        conversational = _turns(_value(rows, prompt))
        return Format(RANKED, {"prompt": prompt, **ranked}, conversational=conversational)
    raise _no_match(columns, forced, rows, ordered)


def _pairs(prompt, chosen, rejected, extras: dict, rows: list[Mapping], forced: str | None) -> Format:
    """prompt/chosen/rejected or chosen/rejected: plain or conversational; answers that are whole conversations
    (they start with a user turn) are implicit-prompt pairs, the `prompt` column then left aside."""
    first_chosen, first_rejected = _value(rows, chosen), _value(rows, rejected)
    if first_chosen is None or first_rejected is None:  # empty in every row looked at: the other one tells
        first_chosen = first_rejected = first_chosen if first_rejected is None else first_rejected
    turns = _turns(first_chosen) and _turns(first_rejected)
    if not turns and not (isinstance(first_chosen, str) and isinstance(first_rejected, str)):
        raise FormatError(
            f"{chosen} and {rejected} must both be strings or both be lists of {{role, content}} "
            f"(got {type(first_chosen).__name__} and {type(first_rejected).__name__})",
            "fix the columns, or map others: --dataset_columns chosen=COLUMN,rejected=COLUMN",
        )
    whole = turns and first_chosen[0].get("role") != "assistant"
    found = {"chosen": chosen, "rejected": rejected, **extras}
    if prompt and not whole and forced != IMPLICIT:
        first_prompt = _value(rows, prompt)
        if turns != _turns(first_prompt):
            raise FormatError(
                f"{prompt} holds {type(first_prompt).__name__} and the answers {type(first_chosen).__name__}: "
                "a prompt and its answers are both text or both message lists",
                "fix the columns",
            )
        return Format(PREFERENCE, {"prompt": prompt, **found}, conversational=turns)
    notes = (f"the {prompt!r} column is left aside: {chosen}/{rejected} hold whole conversations",) if prompt else ()
    return Format(IMPLICIT, found, conversational=turns, notes=notes)


def _no_match(columns: set[str], forced: str | None, rows: list[Mapping], ordered: list[str]) -> FormatError:
    shapes = (
        "preference (prompt, chosen, rejected); preference_implicit (chosen, rejected); unpaired (prompt, "
        "completion, label); ranked (prompt, response_0/response_1 + better_response_id, or response_a/response_b "
        "+ winner or score_a/score_b)"
    )
    what = f"format {forced} needs other columns" if forced else "match no preference format"
    return FormatError(
        f"the columns {', '.join(sorted(columns)) or '(none)'} {what}; preference formats: {shapes}",
        "map your columns: --dataset_columns "
        + (column_example(ordered, rows, ("prompt", "chosen", "rejected")) or "chosen=COLUMN,rejected=COLUMN")
        + " (fields: "
        + ", ".join(sorted(PREFERENCE_FIELDS))
        + ")",
    )
