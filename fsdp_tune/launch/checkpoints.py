"""Find checkpoints in an output dir; `latest` means the newest complete one (launcher side, no torch)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fsdp_tune.runfiles import COMPLETE_MARKER

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    complete: bool


def list_checkpoints(output_dir: str | Path) -> list[Checkpoint]:
    """Checkpoints by step. fsdp-tune writes a marker into each one after Trainer has written everything;
    when no checkpoint has a marker (a run of plain Trainer), trainer_state.json, written near the end,
    stands in for it."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    folders = []
    for child in root.iterdir():
        m = _CHECKPOINT.match(child.name)
        if m and child.is_dir():
            folders.append((int(m.group(1)), child))
    markers = any((f / COMPLETE_MARKER).exists() for _, f in folders)
    done = COMPLETE_MARKER if markers else "trainer_state.json"
    return sorted((Checkpoint(f, step, (f / done).exists()) for step, f in folders), key=lambda c: c.step)


def latest_complete(output_dir: str | Path) -> tuple[Checkpoint | None, list[Checkpoint]]:
    """(newest complete checkpoint, incomplete ones newer than it, which are skipped, never deleted)."""
    found = list_checkpoints(output_dir)
    complete = [c for c in found if c.complete]
    best = complete[-1] if complete else None
    skipped = [c for c in found if not c.complete and (best is None or c.step > best.step)]
    return best, skipped
