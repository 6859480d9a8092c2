"""Checkpoints in an output dir: the completion marker, its verification, and what `latest` means.

Rank 0 writes the marker into a checkpoint once every rank has finished writing it: the run id and every
file with its size (and sha256, for files up to HASH_LIMIT). A checkpoint is complete when its marker is
there, and resumable when every file it lists is still there, as long and (where hashed) the same: a
deleted scheduler.pt or optimizer_0/ would otherwise restart the LR schedule or the optimizer without a
word. `latest` means the newest resumable checkpoint of the run this folder holds. No torch: the launcher
and the ranks (elastic restarts) share this module.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from fsdp_tune.runfiles import COMPLETE_MARKER, MANIFEST_NAME, write_atomic

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
HASH_LIMIT = 64 * 2**20  # bigger files (model shards of a full fine-tune) are checked by size only
BATCH_KEYS = ("world_size", "per_device_train_batch_size", "gradient_accumulation_steps")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    complete: bool
    run_id: str | None = None  # from the marker; None for an earlier fsdp-tune's marker or none
    problem: str | None = None  # why it is not resumed (set by latest_complete and verify)


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
    found = []
    for step, folder in sorted(folders):
        found.append(Checkpoint(folder, step, (folder / done).exists(), marker_run_id(folder)))
    return found


def write_marker(folder: str | Path, step: int, run_id: str | None, batch: dict | None = None) -> Path:
    """Mark `folder` complete: call once every file of the checkpoint is written (by every rank). `batch`: the
    global batch it was trained with (world_size, per_device_train_batch_size, gradient_accumulation_steps)."""
    folder = Path(folder)
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != COMPLETE_MARKER:
            size = path.stat().st_size
            files[path.relative_to(folder).as_posix()] = {
                "size": size,
                "sha256": _sha256(path) if size <= HASH_LIMIT else None,
            }
    marker = {"global_step": step, "run_id": run_id, "files": files, **({"batch": batch} if batch else {})}
    return write_atomic(folder / COMPLETE_MARKER, json.dumps(marker, indent=1))


def read_marker(folder: str | Path) -> dict | None:
    try:
        data = json.loads((Path(folder) / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def verify(folder: str | Path) -> str | None:
    """Why the checkpoint in `folder` cannot be resumed as it was written, or None when it can.

    A marker that lists no files (an earlier fsdp-tune's, or one written by hand) vouches for nothing: not
    trusted. The marker says the files are as written; whether they are safe to load is pickles.py's question."""
    folder = Path(folder)
    if not (folder / COMPLETE_MARKER).exists():
        return f"it has no completion marker ({COMPLETE_MARKER}): it was never finished"
    marker = read_marker(folder)
    if marker is None:
        return f"its completion marker {COMPLETE_MARKER} is unreadable"
    files = marker.get("files")
    if not isinstance(files, dict) or not files or not all(isinstance(r, dict) for r in files.values()):
        return f"its completion marker {COMPLETE_MARKER} lists no files (an earlier fsdp-tune's?): nothing to check"
    for rel, record in files.items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            return f"its completion marker lists {rel}, outside the checkpoint"
        path = folder / rel
        if not path.is_file():
            top = rel.split("/")[0]
            missing = f"{top}/" if "/" in rel and not (folder / top).exists() else rel
            return f"{missing} is missing (listed in its completion marker)"
        size = path.stat().st_size
        if size != record.get("size"):
            return f"{rel} is {size} bytes, {record.get('size')} when written (cut short or replaced)"
        digest = record.get("sha256")
        if digest and _sha256(path) != digest:
            return f"{rel} changed since it was written (sha256 differs)"
    return None


def trained_batch(folder: str | Path) -> dict | None:
    """The batch a checkpoint was trained with: its marker's record, else what the Trainer's files tell (one
    rng_state_K.pth per rank, trainer_state.json's per-device batch; gradient accumulation then unknown)."""
    folder = Path(folder)
    batch = (read_marker(folder) or {}).get("batch")
    if isinstance(batch, dict) and all(isinstance(batch.get(k), int) for k in BATCH_KEYS):
        return batch
    try:
        per_device = json.loads((folder / "trainer_state.json").read_text()).get("train_batch_size")
    except (OSError, ValueError, AttributeError):
        return None
    ranks = len(list(folder.glob("rng_state_*.pth"))) or (1 if (folder / "rng_state.pth").exists() else 0)
    if not isinstance(per_device, int) or not ranks:
        return None
    return {"world_size": ranks, "per_device_train_batch_size": per_device, "gradient_accumulation_steps": None}


def marker_run_id(folder: str | Path) -> str | None:
    """The run a checkpoint belongs to: the run id its completion marker records (None for none)."""
    run_id = (read_marker(folder) or {}).get("run_id")
    return run_id if isinstance(run_id, str) else None


def folder_run_id(output_dir: str | Path) -> str | None:
    """The run this folder holds: the run id its manifest records (None for none, or an earlier fsdp-tune)."""
    try:
        data = json.loads((Path(output_dir) / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return run_id if isinstance(run_id, str) else None


def latest_complete(output_dir: str | Path) -> tuple[Checkpoint | None, list[Checkpoint]]:
    """(the newest checkpoint to resume, the newer ones passed over with the reason in `.problem`).

    Passed over, never deleted: one without a marker (being written when the run stopped), one of another
    run than the one this folder holds, one whose files are no longer as written."""
    run_id = folder_run_id(output_dir)
    skipped = []
    for c in reversed(list_checkpoints(output_dir)):
        if not c.complete:
            skipped.append(replace(c, problem="no completion marker: it was being written when the run stopped"))
            continue
        if run_id and c.run_id and c.run_id != run_id:
            skipped.append(replace(c, problem=f"it belongs to run {c.run_id}, not to this folder's run {run_id}"))
            continue
        problem = verify(c.path) if (c.path / COMPLETE_MARKER).exists() else None
        if problem:
            skipped.append(replace(c, problem=problem))
            continue
        return c, skipped
    return None, skipped


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def restart_checkpoint(output_dir: str | Path) -> str | None:
    """The checkpoint an elastic restart (torchrun --max_restarts) resumes: the newest complete one of this run,
    held to the same check as the launcher's resume, since the launcher never saw it (it was written, or
    planted, after launch; a marker rewritten to match proves nothing). Raises Unsafe, naming PF060, rather
    than passing over it for an older one: a planted pickle is not an accident."""
    from fsdp_tune.rundir.pickles import Unsafe, check_checkpoint

    best, _ = latest_complete(output_dir)
    if best is None:
        return None
    unsafe = check_checkpoint(best.path)
    if unsafe is not None:
        raise Unsafe(
            unsafe.file,
            f"PF060 {unsafe.what}; the restart would load it on every rank (a pickle runs what it names): "
            f"not resumed. Move {best.path} away and resume another (--resume_from_checkpoint PATH)",
        )
    return str(best.path)
