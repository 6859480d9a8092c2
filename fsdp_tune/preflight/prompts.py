"""The data pre-flight for online RL (preflight/data.py runs it in place of SFT's row checks under a generating
method: --method grpo, rloo; decide/datafiles.py prompt_format found the prompt column, or refused data that holds
answers but no prompts, PF014): rows that cannot be used reported with file and line (and skipped on rank 0, counted
in the summary)."""

from __future__ import annotations

from fsdp_tune.errors import Finding, Severity
from fsdp_tune.preflight.rows import Kind
from fsdp_tune.sources.formats import Format
from fsdp_tune.sources.mixture import Source, split_name
from fsdp_tune.sources.prompts import canonical


def notes(split: str, where: str, fmt: Format) -> list[Finding]:
    """What the prompt format says of itself (PF086, notes)."""
    return [Finding("PF086", Severity.NOTE, split, where, note, "") for note in fmt.notes]


KIND = Kind(said=notes, canonical=canonical)  # settle_source's checks under grpo


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
