"""Find checkpoints in an output dir; `latest` means the newest complete one (launcher side, no torch)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fsdp_tune.worker_paths import COMPLETE_MARKER, RESOLVED_NAME

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    complete: bool


def list_checkpoints(output_dir: str | Path) -> list[Checkpoint]:
    out = []
    root = Path(output_dir)
    if not root.is_dir():
        return out
    for child in root.iterdir():
        m = _CHECKPOINT.match(child.name)
        if m and child.is_dir():
            out.append(Checkpoint(child, int(m.group(1)), _is_complete(child)))
    return sorted(out, key=lambda c: c.step)


def _is_complete(folder: Path) -> bool:
    # fsdp-tune writes the marker after Trainer has written everything; a plain Trainer checkpoint
    # has none, and counts as complete when its trainer_state.json (written near the end) is there.
    written_by_us = any(folder.parent.glob(f"*{RESOLVED_NAME}"))
    return (folder / COMPLETE_MARKER).exists() or (not written_by_us and (folder / "trainer_state.json").exists())


def latest_complete(output_dir: str | Path) -> tuple[Checkpoint | None, list[Checkpoint]]:
    """(newest complete checkpoint, incomplete ones newer than it, which are skipped, never deleted)."""
    found = list_checkpoints(output_dir)
    complete = [c for c in found if c.complete]
    best = complete[-1] if complete else None
    skipped = [c for c in found if not c.complete and (best is None or c.step > best.step)]
    return best, skipped
