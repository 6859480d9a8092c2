"""The row findings every data pre-flight shares (preflight/data.py for SFT and preference data,
preflight/prompts.py for GRPO's prompts): rows skipped or reported, counted by reason, with file and line; and the
whole check of a data kind whose rows TRL takes as they stand (a Kind: preference pairs, GRPO's prompts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsdp_tune.decide.datafiles import Look
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.preflight.tokens import listed as _listed
from fsdp_tune.sources.formats import Format
from fsdp_tune.sources.mixture import Source, slice_rows, split_name
from fsdp_tune.sources.rowcheck import problems_by_code
from fsdp_tune.sources.sample import MAX_COLUMNAR_ROWS, MAX_ROWS

COUNTED_ROWS = MAX_COLUMNAR_ROWS  # below it every file was read whole (preflight/batch.py compares it with a step)


def sliced(spec: str, rows: list) -> list:
    """The rows a split slice (train[:5%]) selects, when every row of the split was read."""
    selected = slice_rows(spec, len(rows)) if "[" in spec and len(rows) < MAX_ROWS else None
    return rows[selected.start : selected.stop] if selected is not None else rows


def row_findings(split: str, by_code: dict[str, list[str]], first: dict, total: int) -> list[Finding]:
    findings = []
    skipped = {w for code, wheres in by_code.items() if first[code].skips for w in wheres}
    for code, wheres in by_code.items():
        problem = first[code]
        skip = problem.skips
        detail = f" ({problem.detail})" if problem.detail else ""
        what = "skipped" if skip else "kept, reported"
        message = f"{len(wheres)} row(s) {what}: {problem.reason}{detail} at {_listed(wheres)}"
        severity = Severity.ERROR if skip and len(skipped) >= total else Severity.WARNING
        hint = "fix or remove them (fsdp-tune skips them and counts them in the summary)" if skip else ""
        if severity is Severity.ERROR:
            message, hint = (
                f"every row is skipped; {message}",
                "fix the data, or check --dataset_format/--dataset_columns",
            )
        findings.append(Finding("PF017" if skip else "PF018", severity, split, wheres[0], message, hint))
    return findings


Rows = list[tuple[str, Any]]  # (file:line, the row as read)


@dataclass(frozen=True)
class Kind:
    """A data kind checked the same way whatever it is (its format found by decide/datafiles.py): what the format
    itself says (split, the first row's file:line, the format), each row read by `canonical(row, fmt) -> (row,
    problem or None)`, and how many rows the method trains on per usable row of the format."""

    said: Callable[[str, str, Format], list[Finding]]
    canonical: Callable[[dict, Format], tuple[Any, Any]]
    per_row: Callable[[Format], int] = lambda fmt: 1


def settle_kind(kind: Kind, source: Source, look: Look) -> tuple[int | None, list[Finding]]:
    """check_source's row checks for `kind`: (the training rows the method will train on, counted when every row
    was read; what was found)."""
    fmt, samples = look.fmt, look.samples
    assert fmt is not None  # check_source stops before a source whose format was not found
    first = samples[source.split][0]
    findings = kind.said(split_name(source.split), first.rows[0][0] if first.rows else first.path, fmt)
    for s in look.splits:
        split_rows = sliced(s, [r for x in samples[s] for r in x.rows])
        by_code, first_problem = problems_by_code(split_rows, fmt, kind.canonical)
        findings += row_findings(split_name(s), by_code, first_problem, len(split_rows))
    train_rows = sliced(source.split, [r for x in samples[source.split] for r in x.rows])
    return (_usable(kind, train_rows, fmt) if len(train_rows) < COUNTED_ROWS else None), findings


def _usable(kind: Kind, rows: Rows, fmt: Format) -> int:
    """How many rows the method will train on: each usable row, as many times as the kind makes it."""
    return kind.per_row(fmt) * sum(1 for _, r in rows if isinstance(r, dict) and kind.canonical(r, fmt)[1] is None)
