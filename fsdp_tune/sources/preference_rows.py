"""Preference rows -> TRL's columns, or the reason a row cannot be trained on (pure Python: pre-flight checks every
local row with it, rank 0 converts every row with it; sources/preference.py detects the format).

A pair becomes {prompt, chosen, rejected} (+ margin), an unpaired row {prompt, completion, label}. Implicit
prompts are cut where TRL's own extract_prompt would cut inside a word (it takes the common *character* prefix of
two texts: "w1 w2 w3 w7" / "w1 w2 w3 w8" gives the prompt "w1 w2 w3 w" and the answers "7", "8"): here a text's
prompt ends before the whitespace that starts both answers, and a conversation's at the last turn both share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsdp_tune.sources.convert import clean_message, text
from fsdp_tune.sources.formats import Format, decode_json
from fsdp_tune.sources.preference import (
    FALSE_LABELS,
    IMPLICIT,
    RANKED,
    TIES,
    TRUE_LABELS,
    UNPAIRED,
    Problem,
    suffixes,
)

Row = dict[str, Any]


def split_text(chosen: str, rejected: str) -> tuple[str, str, str]:
    """(prompt, chosen answer, rejected answer) of two texts that share their start: the prompt ends at a word's
    end, where both answers go on with whitespace (or where one ends); never inside a word."""
    n = 0
    limit = min(len(chosen), len(rejected))
    while n < limit and chosen[n] == rejected[n]:
        n += 1
    cut = n
    while cut > 0 and not (_boundary(chosen, cut) and _boundary(rejected, cut) and not chosen[cut - 1].isspace()):
        cut -= 1
    return chosen[:cut], chosen[cut:], rejected[cut:]


def _boundary(value: str, at: int) -> bool:
    return at == len(value) or value[at].isspace()


def split_turns(chosen: list, rejected: list) -> tuple[list, list, list]:
    """(prompt turns, chosen turns, rejected turns): the turns both conversations share, then their own."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    while n > 0 and chosen[n - 1].get("role") == "assistant" and n == min(len(chosen), len(rejected)):
        n -= 1  # one conversation is the other with more turns: the last shared answer is an answer
    return chosen[:n], chosen[n:], rejected[n:]


def _messages(value: Any) -> list:
    return [clean_message(m) for m in value or [] if isinstance(m, Mapping)]


def _empty(value: Any) -> bool:
    if isinstance(value, list):
        return not any(text(m.get("content")).strip() or m.get("tool_calls") for m in value)
    return not text(value).strip()


def canonical(row: Mapping, fmt: Format) -> tuple[Row | None, Problem | None]:
    """One raw row as TRL's pair or unpaired row, or why it cannot be trained on."""
    c = fmt.columns
    required = [c[k] for k in c if k in ("prompt", "chosen", "rejected", "completion", "answer_a", "answer_b")]
    if fmt.kind == IMPLICIT:
        required = [c["chosen"], c["rejected"]]
    missing = [col for col in required if row.get(col) is None]
    if missing:
        return None, Problem("missing", ", ".join(missing))
    if fmt.kind == UNPAIRED:
        return _unpaired(row, fmt)
    if fmt.kind == RANKED:
        chosen, rejected, problem = _ranked(row, fmt)
        if problem:
            return None, problem
    else:
        chosen, rejected = decode_json(row.get(c["chosen"])), decode_json(row.get(c["rejected"]))
    prompt = decode_json(row.get(c["prompt"])) if "prompt" in c and fmt.kind != IMPLICIT else None
    return _pair(prompt, chosen, rejected, row, fmt)


def _pair(prompt, chosen, rejected, row: Mapping, fmt: Format) -> tuple[Row | None, Problem | None]:
    if fmt.conversational:
        if fmt.kind == RANKED:
            chosen, rejected = (
                a if isinstance(a, list) else [{"role": "assistant", "content": text(a)}] for a in (chosen, rejected)
            )
        if not all(isinstance(v, list) for v in (chosen, rejected)) or (
            prompt is not None and not isinstance(prompt, list)
        ):
            return None, Problem("mixed-types", "this dataset's answers are message lists")
        chosen, rejected = _messages(chosen), _messages(rejected)
        if prompt is None:
            prompt, chosen, rejected = split_turns(chosen, rejected)
            if not prompt or prompt[-1].get("role") == "assistant":
                return None, Problem("no-prompt", "no shared turns end with the user's")
        prompt = _messages(prompt)
        for name, answer in (("chosen", chosen), ("rejected", rejected)):
            if answer and answer[0].get("role") != "assistant":
                return None, Problem("not-an-answer", f"{name} starts with a {answer[0].get('role')} turn")
    else:
        if not all(isinstance(v, str) for v in (chosen, rejected)) or (
            prompt is not None and not isinstance(prompt, str)
        ):
            return None, Problem("mixed-types", "this dataset's answers are text")
        if prompt is None:
            prompt, chosen, rejected = split_text(chosen, rejected)
            if not prompt.strip() and chosen != rejected:
                return None, Problem("no-prompt", "the texts share no whole word")
    problem = _pair_problem(chosen, rejected, row, fmt)
    if problem:
        return None, problem
    out: Row = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    if "margin" in fmt.columns:
        out["margin"] = float(row.get(fmt.columns["margin"]) or 0.0)
    return out, None


def _pair_problem(chosen, rejected, row: Mapping, fmt: Format) -> Problem | None:
    if _empty(chosen):
        return Problem("empty-chosen")
    if _empty(rejected):
        return Problem("empty-rejected")
    if chosen == rejected:
        return Problem("identical")
    c = fmt.columns
    if "score_chosen" in c and "score_rejected" in c:
        sc, sr = row.get(c["score_chosen"]), row.get(c["score_rejected"])
        if sc is not None and sc == sr:
            return Problem("tie", f"score {sc}")
    return None


def _ranked(row: Mapping, fmt: Format) -> tuple[Any, Any, Problem | None]:
    """(chosen, rejected, None) from two answers and what ranks them, or a problem."""
    c = fmt.columns
    a, b = decode_json(row.get(c["answer_a"])), decode_json(row.get(c["answer_b"]))
    sa, sb = suffixes(c)
    if "winner" in c:
        said = str(row.get(c["winner"])).strip().lower()
        if said in TIES or said.startswith("tie"):
            return None, None, Problem("tie", f"{c['winner']} {said!r}")
        names = {
            side: {suffix, f"model_{suffix}", f"response_{suffix}", c[key]}
            for side, suffix, key in (("a", sa, "answer_a"), ("b", sb, "answer_b"))
        }
        if said in names["a"]:
            return a, b, None
        if said in names["b"]:
            return b, a, None
        return None, None, Problem("no-preference", f"{c['winner']} {said!r}")
    score_a, score_b = row.get(c["score_a"]), row.get(c["score_b"])
    try:
        score_a, score_b = float(score_a), float(score_b)
    except (TypeError, ValueError):
        return None, None, Problem("no-preference", f"scores {score_a!r}, {score_b!r}")
    if score_a == score_b:
        return None, None, Problem("tie", f"scores {score_a:g}")
    return (a, b, None) if score_a > score_b else (b, a, None)


def _unpaired(row: Mapping, fmt: Format) -> tuple[Row | None, Problem | None]:
    c = fmt.columns
    prompt, completion, label = (decode_json(row.get(c[k])) for k in ("prompt", "completion", "label"))
    if isinstance(label, str) and label.strip().lower() in TRUE_LABELS | FALSE_LABELS:
        label = label.strip().lower() in TRUE_LABELS
    elif isinstance(label, int) and label in (0, 1):
        label = bool(label)
    if not isinstance(label, bool):
        return None, Problem("bad-label", f"{c['label']} {label!r}")
    if fmt.conversational:
        if not isinstance(prompt, list) or not isinstance(completion, list):
            return None, Problem("mixed-types", "this dataset's prompts and completions are message lists")
        prompt, completion = _messages(prompt), _messages(completion)
    elif not isinstance(prompt, str) or not isinstance(completion, str):
        return None, Problem("mixed-types", "this dataset's prompts and completions are text")
    if _empty(completion):
        return None, Problem("empty-completion")
    return {"prompt": prompt, "completion": completion, "label": label}, None


def unpair(pair: Row) -> list[Row]:
    """A pair as KTO's two rows: the chosen answer desirable, the rejected one not (TRL's unpair_preference_dataset
    does the same, but keeps a whole map batch of desirable rows before the undesirable ones)."""
    return [
        {"prompt": pair["prompt"], "completion": pair["chosen"], "label": True},
        {"prompt": pair["prompt"], "completion": pair["rejected"], "label": False},
    ]
