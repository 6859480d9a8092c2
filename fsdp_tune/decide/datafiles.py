"""What the data files say, read once on the launcher (no `datasets`, no torch): every local source located, its
splits' files sampled, its format detected. A decide-stage input, as the Machine is: decide/data.py writes what the
ranks need of it into the spec's Sources (loader, files, the detected format, the held-out split, train_on_prompt),
and the data pre-flight (preflight/data.py) checks the same rows and reports what it counts beside the spec
(`Counted`), never in it. A Hub dataset is not read here: rank 0 detects its format (worker/data/prepare.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from fsdp_tune.config.methods import row_of
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.sources import preference_check
from fsdp_tune.sources.data import Located, locate
from fsdp_tune.sources.formats import AUTO, Format, FormatError, detect_format, renders_to_text
from fsdp_tune.sources.mixture import Source, split_name
from fsdp_tune.sources.prompts import detect_prompts
from fsdp_tune.sources.sample import SCAN_SECONDS, Sample, read_sample

DETECT_ROWS = 100  # rows detection looks at


@dataclass
class Look:
    """One source's files as read here. `fmt` None: nothing more is known (a Hub dataset, or `findings` say why)."""

    located: Located | None = None  # None: a Hub dataset
    splits: list[str] = field(default_factory=list)  # the split specs read: training, then held-out when wanted
    samples: dict[str, list[Sample]] = field(default_factory=dict)  # split spec -> its files' rows
    files: dict[str, list[str]] = field(default_factory=dict)  # split name -> its files
    findings: list[Finding] = field(default_factory=list)  # PF010, PF012, PF013, PF014, PF019, PF072
    fmt: Format | None = None
    as_text: bool = False  # rendered into PEFT's text field, every token trained (renders_to_text)

    @property
    def local(self) -> bool:
        return self.located is not None

    def settled(self, source: Source) -> Source:
        """The source as the ranks read it: where its files are and which format they hold."""
        if self.fmt is None or self.located is None:
            return source
        return replace(
            source,
            eval_split=self.splits[1] if len(self.splits) > 1 else None,
            loader=self.located.loader,
            files=self.files,
            detected=self.fmt,
            train_on_prompt=source.train_on_prompt or self.as_text,
        )


@dataclass(frozen=True)
class Counted:
    """What the data pre-flight counted of one source, reported beside the spec (the plan's lines, PF064, the
    memory plan's largest image); the ranks need none of it."""

    rows_checked: int | None = None  # training rows found usable; None: not counted (many, or a Hub dataset)
    tokenized: dict[str, Any] | None = None  # train's pre-flight tokenizing: {rows, of, skipped} or {why_not}
    images: dict[str, Any] | None = None  # preflight/images.py Found.as_dict of the training split; None: none


def read(
    sources: tuple[Source, ...], text_field: str, peft_text_field: str | None, eval_wanted: bool, method: str = "sft"
) -> tuple[Look, ...]:
    """One Look per source, in order."""
    return tuple(look(s, text_field, peft_text_field, eval_wanted, method) for s in sources)


def look(source: Source, text_field: str, peft_text_field: str | None, eval_wanted: bool, method: str) -> Look:
    """long because it is one source's story, step by step: where, which splits, readable, consistent, which
    format; each step that fails ends it with its finding."""
    located = locate(source)
    if not located.is_local:
        return Look()
    out = Look(located)
    if located.problem:
        rule = "PF019" if located.files else "PF010"
        out.findings.append(_error(rule, "--dataset_name", source.path, located.problem, located.hint))
        return out
    train = split_name(source.split)
    if train not in located.files:
        found = ", ".join(sorted(located.files)) or "none"
        message = f"{source.path}: no data files for the {train} split (splits found: {found})"
        hint = "--dataset_train_split NAME (or --splits), or name the files train.jsonl / test.jsonl"
        out.findings.append(_error("PF010", "--dataset_name", source.path, message, hint))
        return out
    eval_split = source.eval_split if eval_wanted else None
    if eval_split and split_name(eval_split) not in located.files:
        message = f"{source.path}: evaluation needs a held-out split, and there is no {split_name(eval_split)} split"
        hint = "--dataset_test_split NAME, --test_split_size 0.1, or --eval_strategy no"
        out.findings.append(_error("PF013", "--eval_strategy", source.path, message, hint))
        eval_split = None
    splits = out.splits = [s for s in (source.split, eval_split) if s]
    files = out.files = {split_name(s): located.files[split_name(s)] for s in splits}
    read_once = {name: [read_sample(f, located.loader or "json") for f in fs] for name, fs in files.items()}
    samples = out.samples = {s: read_once[split_name(s)] for s in splits}  # train[:90%], train[90%:]: read once
    problems = [_error(p[0], split_name(s), p[1], p[2], p[3]) for s in splits for x in samples[s] if (p := x.problem)]
    problems += [_consistency(split_name(s), samples[s]) for s in splits if len(samples[s]) > 1]
    out.findings += [_unscanned(split_name(s), x) for s in splits for x in samples[s] if x.unscanned]
    empty = [s for s in splits if not any(x.rows or x.problem for x in samples[s])]
    problems += [
        _error("PF013", split_name(s), files[split_name(s)][0], f"the {split_name(s)} split is empty", "add rows")
        for s in empty
    ]
    if any(problems):
        out.findings += [p for p in problems if p is not None]
        return out
    first = samples[source.split][0]
    rows = [r for x in samples[source.split] for _, r in x.rows][:DETECT_ROWS]
    try:
        out.fmt = _detect(first.columns, [r for r in rows if isinstance(r, dict)], source, text_field, method)
    except FormatError as e:
        out.findings.append(_error("PF014", split_name(source.split), first.path, str(e), e.hint))
        return out
    if not (row_of(method).generates or row_of(method).preference):  # TRL's rows as they stand otherwise
        out.fmt, out.as_text = renders_to_text(out.fmt, first.columns, peft_text_field)
    return out


def _detect(columns: list[str], rows: list[dict], source: Source, text_field: str, method: str) -> Format:
    """The format of the method's data kind: prompts for a generating method, preference rows for a preference
    method, else SFT's formats."""
    row = row_of(method)
    if row.generates:
        return prompt_format(columns, rows, source, method)
    if row.preference:
        return preference_check.detect(columns, rows, source, method)
    return sft_format(columns, rows, source, text_field)


def sft_format(columns: list[str], rows: list[dict], source: Source, text_field: str) -> Format:
    """The dataset's format; JSON lines may differ row to row, so the format most rows have wins (the others
    are then refused as rows of another format, PF016)."""
    forced = source.format
    if forced == AUTO and rows:
        votes: Counter[str] = Counter()
        for row in rows:
            try:
                votes[detect_format(row.keys(), [row], column_map=source.column_map, text_field=text_field).kind] += 1
            except FormatError:
                continue
        forced = votes.most_common(1)[0][0] if len(votes) > 1 else AUTO
    return detect_format(columns, rows, forced=forced, column_map=source.column_map, text_field=text_field)


def prompt_format(columns: list[str], rows: list[dict], source: Source, method: str = "grpo") -> Format:
    """The prompt-only format of a source; FormatError naming SFT or preference data without a prompt."""
    try:
        return detect_prompts(columns, rows, forced=source.format, column_map=source.column_map)
    except FormatError as e:
        try:
            other = detect_format(columns, rows, forced=None, column_map={})
        except FormatError:
            raise e from None
        raise FormatError(
            f"this is supervised fine-tuning data ({other.describe()}) without a prompt column; --method {method} "
            "generates the answers itself and trains on prompts",
            "give {prompt: ...} rows (and the columns your rewards read), or name the prompt column: "
            "--dataset_columns prompt=COLUMN",
        ) from None


def _error(rule: str, key: str, where: str, message: str, hint: str = "") -> Finding:
    return Finding(rule, Severity.ERROR, key, where, message, hint)


def _unscanned(split: str, sample: Sample) -> Finding:
    message = (
        f"{sample.path}: its lines were parsed up to line {sample.unscanned:,} within {SCAN_SECONDS:.0f} s; "
        "a malformed line past it is found by rank 0 only"
    )
    return Finding("PF072", Severity.NOTE, split, f"{sample.path}:{sample.unscanned}", message, "")


def _consistency(split: str, samples: list[Sample]) -> Finding | None:
    """#17: the files of one split must share their columns: `datasets` unifies them into one table."""
    first = samples[0]
    for other in samples[1:]:
        if set(other.columns) != set(first.columns) and other.rows:
            return _error(
                "PF019",
                split,
                other.path,
                f"its columns ({', '.join(other.columns)}) differ from {first.path}'s ({', '.join(first.columns)}); "
                "the files of one split are read as one table",
                "keep files of one format per split, or list each as its own `datasets:` entry",
            )
    return None
