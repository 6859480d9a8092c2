"""What a failed rank reports. torchrun's @record writes the error file (the failure report's root cause)
for Exceptions only; torch raises some failures as BaseExceptions (torch.distributed.checkpoint's
CheckpointException, for a checkpoint file missing or cut short), which would otherwise leave the report
with "exited with code 1 without a Python exception" and the file named only in the rank's log."""

from __future__ import annotations

import json
from pathlib import Path


def describe(err: BaseException, resolved_path: str | None = None) -> str:
    """One line naming what failed: for a checkpoint, the first failed rank's own exception (which names a
    missing file; a corrupt one it does not name, so the checkpoint being resumed is added)."""
    failures = getattr(err, "failures", None)
    if not (isinstance(failures, dict) and failures):
        return f"{type(err).__name__}: {' '.join(str(err).split())}"
    rank, pair = min(failures.items(), key=lambda item: item[0])
    inner = pair[0] if isinstance(pair, tuple) else pair
    text = " ".join(str(inner).split())
    resuming = _resuming(resolved_path)
    where = f" while resuming {resuming}" if resuming else ""
    return (
        f"{type(err).__name__} (checkpoint read or write failed on rank {rank}{where}): {type(inner).__name__}: {text}"
    )


def _resuming(resolved_path: str | None) -> str | None:
    try:
        return json.loads(Path(resolved_path or "").read_text())["spec"]["resume_from_checkpoint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
