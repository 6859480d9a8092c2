"""Dataset formats, told apart by their columns and a look at the values (no `datasets`, no torch).

    text               one string per row; every token is trained (TRL's "language modeling")
    messages           [{role, content, ...}]: system/user/assistant/tool turns, `tool_calls` pass through
    prompt_completion  prompt + completion, both strings or both message lists (TRL's two forms)
    alpaca             instruction, optional input, output, optional system / history
    sharegpt           conversations: [{from, value}] with human/gpt/system and their variants

The launcher detects the format of every local file from a sample of rows (pre-flight), rank 0 does the
same for a Hub dataset; both call `detect_format`. convert.py turns rows into TRL's representation,
rowcheck.py finds rows that cannot be trained on.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

TEXT = "text"
MESSAGES = "messages"
PROMPT_COMPLETION = "prompt_completion"
ALPACA = "alpaca"
SHAREGPT = "sharegpt"
KINDS = (TEXT, MESSAGES, PROMPT_COMPLETION, ALPACA, SHAREGPT)
AUTO = "auto"
PRIORITY = (MESSAGES, SHAREGPT, PROMPT_COMPLETION, ALPACA, TEXT)  # first match wins; the others are noted

# Each kind's logical fields and the column names tried for each (first match wins); --dataset_columns
# (logical=column) overrides them. Required fields come first in REQUIRED.
FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    TEXT: {"text": ("text",)},
    MESSAGES: {"messages": ("messages",), "tools": ("tools",), "images": ("images", "image")},
    PROMPT_COMPLETION: {"prompt": ("prompt",), "completion": ("completion",), "tools": ("tools",)},
    ALPACA: {
        "instruction": ("instruction",),
        "input": ("input", "context"),
        "output": ("output", "response"),
        "system": ("system",),
        "history": ("history",),
    },
    SHAREGPT: {
        "conversations": ("conversations",),
        "system": ("system",),
        "tools": ("tools",),
        "images": ("images", "image"),  # sources/vision.py: `<image>` placeholders in the turns
    },
}
# preference data (sources/preference.py): its kinds and the fields --dataset_columns may name for them
PREFERENCE_KINDS = ("preference", "preference_implicit", "unpaired", "ranked")
PREFERENCE_FIELDS = frozenset({"prompt", "chosen", "rejected", "completion", "label", "answer_a", "answer_b", "winner"})
# prompt-only data for online RL (sources/prompts.py): the prompt, and columns the rewards read
PROMPT_KINDS = ("prompt_only",)
# what --dataset_columns may name
ALL_FIELDS = frozenset(f for kind in KINDS for f in FIELDS[kind]) | PREFERENCE_FIELDS
REQUIRED = {
    TEXT: ("text",),
    MESSAGES: ("messages",),
    PROMPT_COMPLETION: ("prompt", "completion"),
    ALPACA: ("instruction", "output"),
    SHAREGPT: ("conversations",),
}
ROLE_KEYS = ("from", "role")
CONTENT_KEYS = ("value", "content", "text")


class FormatError(ValueError):
    """No known format matches, or a forced format lacks its columns: a message and one concrete fix."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Format:
    """A detected (or forced) format: the kind and which column holds each logical field."""

    kind: str
    columns: dict[str, str]  # logical field -> dataset column, only the fields present
    conversational: bool = False  # prompt_completion holding message lists
    role_key: str = "role"  # sharegpt: the speaker's key in each turn
    content_key: str = "content"  # sharegpt: the text's key in each turn
    notes: tuple[str, ...] = field(default=())  # what detection noticed (another match, JSON text columns)

    def describe(self) -> str:
        extra = " (conversational)" if self.conversational else ""
        if self.kind == SHAREGPT:
            extra = f" ({self.role_key}/{self.content_key})"
        renamed = [f"{k}={v}" for k, v in self.columns.items() if k != v]
        return self.kind + extra + (f" [{', '.join(renamed)}]" if renamed else "")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Format:
        return cls(**{**data, "columns": dict(data["columns"]), "notes": tuple(data.get("notes", ()))})


def decode_json(value: Any) -> Any:
    """CSV/TSV cells (and some parquet exports) hold lists as JSON text: '[...]' and '{...}' are decoded."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _first_value(rows: list[Mapping], column: str) -> Any:
    for row in rows:
        value = decode_json(row.get(column))
        if value not in (None, "", []):
            return value
    return None


def turn_keys(value: Any, role_keys=("role",), content_keys=("content",)) -> tuple[str, str] | None:
    """(role key, content key) when `value` is a non-empty list of dicts keyed that way."""
    if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
        return None
    first = value[0]
    for rk in role_keys:
        if rk in first:
            for ck in content_keys:
                if any(ck in m for m in value):
                    return rk, ck
            if rk == "role":  # an assistant turn with only tool_calls has no content at all
                return rk, "content"
    return None


def resolve_columns(kind: str, columns: set[str], column_map: Mapping[str, str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for logical, candidates in FIELDS[kind].items():
        if logical in column_map:
            if column_map[logical] in columns:
                found[logical] = column_map[logical]
            continue
        for candidate in candidates:
            if candidate in columns:
                found[logical] = candidate
                break
    return found


def detect_format(
    columns: Iterable[str],
    rows: list[Mapping],
    *,
    forced: str | None = None,
    column_map: Mapping[str, str] | None = None,
    text_field: str = "text",
) -> Format:
    """The format of a dataset from its column names and a few rows (values are looked at: a `messages`
    column of strings is not a chat). `forced` (--dataset_format) skips the guessing but still checks the
    columns; `column_map` (--dataset_columns logical=column) and `text_field` (--dataset_text_field) rename."""
    ordered, columns = list(dict.fromkeys(columns)), set(columns)
    column_map = dict(column_map or {})
    _check_map(columns, column_map)
    if text_field != "text":
        column_map.setdefault("text", text_field)
    forced = None if forced in (None, AUTO) else forced
    if forced and forced not in KINDS:
        raise FormatError(f"unknown format {forced!r}", f"--dataset_format one of: {AUTO}, {', '.join(KINDS)}")
    candidates: list[Format] = []
    rejected: list[str] = []
    for kind in [forced] if forced else PRIORITY:
        found = resolve_columns(kind, columns, column_map)
        missing = [f for f in REQUIRED[kind] if f not in found]
        if missing and forced:
            raise FormatError(
                f"format {kind} needs column(s) {', '.join(missing)}; the columns are {_names(columns)}",
                "map them: --dataset_columns " + ",".join(f"{m}=YOUR_COLUMN" for m in missing),
            )
        if missing:
            if len(missing) < len(REQUIRED[kind]):
                rejected.append(f"{kind} would also need {', '.join(missing)}")
            continue
        fmt, why_not = _check_values(kind, found, rows)
        if fmt is None and forced:
            raise FormatError(str(why_not), "fix the column, or choose another --dataset_format")
        if fmt is not None:
            candidates.append(fmt)
        elif why_not:
            rejected.append(why_not)
    if not candidates:
        raise no_match(ordered, rejected, rows)
    chosen = candidates[0]
    if len(candidates) > 1:
        others = ", ".join(c.kind for c in candidates[1:])
        note = f"also matches {others}; read as {chosen.kind} (--dataset_format chooses)"
        chosen = Format(**{**asdict(chosen), "notes": (*chosen.notes, note)})
    return chosen


def _names(columns: Iterable[str]) -> str:
    return ", ".join(sorted(columns)) or "(none)"


def _check_map(columns: set[str], column_map: Mapping[str, str]) -> None:
    known = ALL_FIELDS
    unknown = sorted(set(column_map) - known)
    if unknown:
        raise FormatError(
            f"--dataset_columns names unknown field(s) {', '.join(unknown)}",
            f"fields are: {', '.join(sorted(known))} (field=YOUR_COLUMN)",
        )
    absent = {k: v for k, v in column_map.items() if v not in columns}
    if absent:
        raise FormatError(
            "--dataset_columns names columns the data lacks: " + ", ".join(f"{k}={v}" for k, v in absent.items()),
            f"the columns are {_names(columns)}",
        )


def _check_values(kind: str, found: dict[str, str], rows: list[Mapping]) -> tuple[Format | None, str | None]:
    if kind in (TEXT, ALPACA):
        column = found["text" if kind == TEXT else "instruction"]
        value = _first_value(rows, column)
        if value is not None and not isinstance(value, str):
            return None, f"column {column!r} holds {type(value).__name__}, not text"
        return Format(kind, found), None
    if kind == PROMPT_COMPLETION:
        prompt, completion = _first_value(rows, found["prompt"]), _first_value(rows, found["completion"])
        if isinstance(prompt, str) and isinstance(completion, str):
            return Format(kind, found), None
        if turn_keys(prompt) and turn_keys(completion):
            return Format(kind, found, conversational=True), None
        return None, (
            "prompt and completion must both be strings or both be lists of {role, content} "
            f"(got {type(prompt).__name__} and {type(completion).__name__})"
        )
    return _check_turns(kind, found, rows)


def _check_turns(kind: str, found: dict[str, str], rows: list[Mapping]) -> tuple[Format | None, str | None]:
    column = found["messages" if kind == MESSAGES else "conversations"]
    raw = next((r.get(column) for r in rows if r.get(column) not in (None, "", [])), None)
    value = decode_json(raw)
    notes = (f"column {column!r} holds JSON text, decoded per row",) if isinstance(raw, str) else ()
    if value is None:
        return None, f"column {column!r} is empty in every row looked at"
    keys = turn_keys(value, ROLE_KEYS, CONTENT_KEYS)
    if keys is None:
        return None, f"column {column!r} is not a list of turns ({{role, content}} or {{from, value}})"
    if kind == MESSAGES and keys == ("role", "content"):
        return Format(MESSAGES, found, notes=notes), None
    if kind == MESSAGES:  # a `messages` column of from/value turns: ShareGPT under another name
        found = {"conversations": column, **{k: v for k, v in found.items() if k != "messages"}}
        notes += (f"column {column!r} holds {keys[0]}/{keys[1]} turns: read as sharegpt",)
    return Format(SHAREGPT, found, role_key=keys[0], content_key=keys[1], notes=notes), None


def no_match(ordered: Iterable[str], rejected: list[str], rows: list[Mapping] = ()) -> FormatError:
    """Refusal naming the columns, each format with the columns it needs, and the closest names (or a mapping of
    the data's own columns: column_example)."""
    ordered = list(ordered)
    columns = set(ordered)
    known = "; ".join(f"{kind} ({', '.join(FIELDS[kind][f][0] for f in REQUIRED[kind])})" for kind in KINDS)
    message = f"the columns {_names(columns)} match no format; known formats: {known}"
    if rejected:
        message += "; " + "; ".join(rejected)
    wanted = {c for kind in KINDS for names in FIELDS[kind].values() for c in names}
    close = {c: m[0] for c in sorted(columns - wanted) if (m := difflib.get_close_matches(c, wanted, n=1, cutoff=0.75))}
    if close:
        pairs = ",".join(f"{_logical(target)}={column}" for column, target in close.items())
        return FormatError(message, f"--dataset_columns {pairs} (or rename the columns)")
    example = column_example(ordered, rows)
    if example:
        return FormatError(message, f"map your columns, e.g. --dataset_columns {example} (or rename the columns)")
    return FormatError(
        message, "map your columns: --dataset_columns prompt=YOUR_PROMPT_COLUMN,completion=YOUR_ANSWER_COLUMN"
    )


def column_example(
    columns: Iterable[str], rows: list[Mapping], fields: tuple[str, ...] = ("prompt", "completion")
) -> str:
    """`field=column,...` for --dataset_columns, built from the data's own columns in their order: a column of
    turns as `messages` (`conversations` for from/value turns); else its text columns as `fields` in turn (the
    last ones dropped when there are fewer, down to two; one text column is `text`); '' when nothing fits."""
    columns = list(columns)
    for column in columns:
        keys = turn_keys(_first_value(rows, column), ROLE_KEYS, CONTENT_KEYS)
        if keys is not None and len(fields) == 2:
            return f"{'messages' if keys == ('role', 'content') else 'conversations'}={column}"
    texts = [c for c in columns if isinstance(_first_value(rows, c), str)] if rows else columns
    if len(texts) >= 2:
        named = fields if len(texts) >= len(fields) else fields[len(fields) - 2 :]
        return ",".join(f"{f}={c}" for f, c in zip(named, texts, strict=False))
    if len(texts) == 1 and len(fields) == 2:
        return f"text={texts[0]}"
    return ""


def _logical(column: str) -> str:
    """The logical field a known column name stands for ('response' -> 'output')."""
    for kind in KINDS:
        for logical, names in FIELDS[kind].items():
            if column in names:
                return logical
    return column


def renders_to_text(fmt: Format, columns: Iterable[str], peft_text_field: str | None) -> tuple[Format, bool]:
    """PEFT's examples/sft path (the seed scripts): a chat template is chosen and --dataset_text_field names a
    column the data lacks: the chat is rendered into that text and trained on every token, as there.
    (the format, noted when so; whether it is so)"""
    if not peft_text_field or fmt.kind != MESSAGES or peft_text_field in set(columns):
        return fmt, False
    note = (
        f"PEFT's examples path (a chat template and --dataset_text_field {peft_text_field}): the chats are "
        "rendered into that text and trained on every token; --train_on_prompt false trains the answers only"
    )
    return Format(**{**asdict(fmt), "notes": (*fmt.notes, note)}), True
