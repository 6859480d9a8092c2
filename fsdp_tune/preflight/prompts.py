"""The data pre-flight for online RL (preflight/data.py runs it in place of SFT's format checks under a generating
method: --method grpo, rloo): the prompt column found, rows that cannot be used reported with file and line (and
skipped on rank 0, counted in the summary), data that holds answers but no prompts refused naming what it is
(PF014)."""

from __future__ import annotations

from fsdp_tune.errors import Finding, Severity
from fsdp_tune.preflight.rows import Kind
from fsdp_tune.sources.formats import Format, FormatError, detect_format
from fsdp_tune.sources.mixture import Source, split_name
from fsdp_tune.sources.prompts import canonical, detect_prompts


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
            f"this is supervised fine-tuning data ({other.describe()}) without a prompt column; a generating "
            "method (online RL) generates the answers itself and trains on prompts",
            "give {prompt: ...} rows (and the columns your rewards read), or name the prompt column: "
            "--dataset_columns prompt=COLUMN",
        ) from None


def notes(split: str, where: str, fmt: Format) -> list[Finding]:
    """What the prompt format says of itself (PF086, notes)."""
    return [Finding("PF086", Severity.NOTE, split, where, note, "") for note in fmt.notes]


KIND = Kind(detect=detect, said=notes, canonical=canonical)  # settle_source's checks under grpo


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
