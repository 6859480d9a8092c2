"""The row findings every data pre-flight shares (preflight/data.py for SFT and preference data,
preflight/prompts.py for GRPO's prompts): rows skipped or reported, counted by reason, with file and line."""

from __future__ import annotations

from fsdp_tune.errors import Finding, Severity
from fsdp_tune.preflight.tokens import listed as _listed
from fsdp_tune.sources.mixture import slice_rows
from fsdp_tune.sources.sample import MAX_COLUMNAR_ROWS, MAX_ROWS

DETECT_ROWS = 100  # rows detection looks at
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
