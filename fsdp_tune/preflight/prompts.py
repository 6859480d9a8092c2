"""The data pre-flight for online RL (preflight/data.py runs it in place of SFT's format checks under
--method grpo): the prompt column found, rows that cannot be used reported with file and line (and skipped on rank 0,
counted in the summary), data that holds answers but no prompts refused naming what it is (PF014)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fsdp_tune.errors import Finding, Severity
from fsdp_tune.preflight.rows import COUNTED_ROWS, DETECT_ROWS, row_findings, sliced
from fsdp_tune.sources.formats import Format, FormatError, detect_format
from fsdp_tune.sources.mixture import Source, split_name
from fsdp_tune.sources.prompts import canonical, detect_prompts
from fsdp_tune.sources.rowcheck import problems_by_code


def detect(columns: list[str], rows: list[dict], source: Source) -> Format:
    """The prompt-only format of a source; FormatError naming SFT or preference data without a prompt."""
    try:
        return detect_prompts(columns, rows, forced=source.format, column_map=source.column_map)
    except FormatError as e:
        try:
            other = detect_format(columns, rows, forced=None, column_map={})
        except FormatError:
            raise e from None
        raise FormatError(
            f"this is supervised fine-tuning data ({other.describe()}) without a prompt column; --method grpo "
            "generates the answers itself and trains on prompts",
            "give {prompt: ...} rows (and the columns your rewards read), or name the prompt column: "
            "--dataset_columns prompt=COLUMN",
        ) from None


def check_rows(rows: list[tuple[str, Any]], fmt: Format) -> tuple[dict, dict]:
    """(problem code -> the rows with it, problem code -> its first problem), for preflight/rows.py row_findings."""
    return problems_by_code(rows, fmt, canonical)


def settle(source: Source, splits: list[str], samples: dict, located) -> tuple[Source, list[Finding]]:
    """settle_source's format and row checks under --method grpo."""
    first = samples[source.split][0]
    rows = [r for x in samples[source.split] for _, r in x.rows]
    try:
        fmt = detect(first.columns, [r for r in rows[:DETECT_ROWS] if isinstance(r, dict)], source)
    except FormatError as e:
        return source, [Finding("PF014", Severity.ERROR, split_name(source.split), first.path, str(e), e.hint)]
    findings: list[Finding] = [
        Finding("PF086", Severity.NOTE, split_name(source.split), first.path, note, "") for note in fmt.notes
    ]
    for s in splits:
        split_rows = sliced(s, [r for x in samples[s] for r in x.rows])
        by_code, first_problem = check_rows(split_rows, fmt)
        findings += row_findings(split_name(s), by_code, first_problem, len(split_rows))
    train_rows = sliced(source.split, [r for x in samples[source.split] for r in x.rows])
    usable = sum(1 for _, r in train_rows if isinstance(r, dict) and canonical(r, fmt)[1] is None)
    settled = replace(
        source,
        eval_split=splits[1] if len(splits) > 1 else None,
        loader=located.loader,
        files={split_name(s): located.files[split_name(s)] for s in splits},
        detected=fmt.as_dict(),
        rows_checked=usable if len(train_rows) < COUNTED_ROWS else None,
    )
    return settled, findings


def first_row(source: Source) -> dict | None:
    """The first usable row of a settled local source, as the rewards will see it (None: a Hub dataset, or none)."""
    from fsdp_tune.sources.sample import read_sample

    files = source.files.get(split_name(source.split)) or []
    if not files or source.detected is None:
        return None
    fmt = Format.from_dict(source.detected)
    for _, row in read_sample(files[0], source.loader or "json").rows:
        if isinstance(row, dict):
            out, problem = canonical(row, fmt)
            if problem is None:
                return out
    return None
