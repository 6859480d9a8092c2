"""The data pre-flight for online RL (preflight/data.py runs it in place of SFT's row checks under a generating
method: --method grpo, rloo; decide/datafiles.py prompt_format found the prompt column, or refused data that holds
answers but no prompts, PF014): rows that cannot be used reported with file and line (and skipped on rank 0, counted
in the summary)."""

from __future__ import annotations

from fsdp_tune.decide.datafiles import Look
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.preflight.rows import Kind
from fsdp_tune.sources.formats import Format
from fsdp_tune.sources.mixture import Source
from fsdp_tune.sources.prompts import canonical


def notes(split: str, where: str, fmt: Format) -> list[Finding]:
    """What the prompt format says of itself (PF086, notes)."""
    return [Finding("PF086", Severity.NOTE, split, where, note, "") for note in fmt.notes]


KIND = Kind(said=notes, canonical=canonical)  # settle_source's checks under grpo


def first_row(source: Source, look: Look) -> tuple[dict, str] | None:
    """The first usable row of a settled local source, as the rewards will see it, and where it is (file:line): from
    the rows decide/datafiles.py read once for the spec, never the file again. None: a Hub dataset, or no usable row."""
    if source.detected is None or not look.splits:
        return None
    fmt = source.detected
    for sample in look.samples.get(look.splits[0], []):
        for where, row in sample.rows:
            if isinstance(row, dict):
                out, problem = canonical(row, fmt)
                if problem is None:
                    return out, where
    return None
