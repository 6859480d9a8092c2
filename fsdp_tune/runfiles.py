"""Every file a run writes into its output folder, by name, and how they are written.

The launcher and the ranks share these names; nothing else spells them. Writes that another process
may read while they happen go through `write_atomic`, which stays safe when several launchers share
one output folder (multi-node jobs on NFS or Lustre see the same OUTPUT_DIR from every node).

No write follows a link out of the folder: `write_atomic` (the one way a file is rewritten, in a run folder or, through
output/files.py, outside one) replaces a link rather than writing through it,
files appended to (the lock, logs/rank-K.log, metrics.jsonl) are opened with O_NOFOLLOW below the output
folder, and the pre-flight refuses a folder that holds links at all (`links_in`).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

RESOLVED_NAME = "fsdp_tune_resolved.json"  # the rank spec (and the config it came from), read by every rank
SUMMARY_NAME = "fsdp_tune_summary.json"  # written by rank 0 at the end: the typed RunSummary
MANIFEST_NAME = "fsdp_tune_run.json"  # what ran, how, with which versions, how it ended
COMPLETE_MARKER = "fsdp_tune_complete"  # inside a checkpoint folder, once every file of it is written
STOP_FILE = "fsdp_tune_stop"  # written by the launcher on SIGINT/SIGTERM: finish the step, checkpoint, stop
METRICS_NAME = "metrics.jsonl"  # one line per logging step (rank 0)
PREVIOUS_METRICS_NAME = "metrics.previous.jsonl"  # an overwritten run's metrics, kept aside
LOSS_PLOT_NAME = "loss.png"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
LOG_DIR = "logs"  # logs/rank-K.log for every rank, logs/torchrun/ for torchrun's own files
LOCK_NAME = "fsdp_tune.lock"  # held by the run that owns the folder (rundir/ownership.py); empty when free
RUN_ID_ENV = "FSDP_TUNE_RUN_ID"  # the ranks' environment: the run id they write into markers and metrics
PREVIOUS_RUN_INFIX = ".previous-"  # --overwrite_output_dir moves a run to OUTPUT_DIR.previous-RUNID beside it
DATA_DIR = "fsdp_tune_data"  # the data as rank 0 prepared it (worker/data/prepare.py): the other ranks read it


def resolved_name(node_rank: int, nnodes: int) -> str:
    """One rank-spec file per machine: with a shared output dir, machines must not overwrite each other's."""
    return RESOLVED_NAME if nnodes == 1 else f"node{node_rank}-{RESOLVED_NAME}"


def rank_log(output_dir: str | os.PathLike, rank: int | str) -> Path:
    return Path(output_dir) / LOG_DIR / f"rank-{rank}.log"


def torchrun_log_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / LOG_DIR / "torchrun"


def links_in(output_dir: str | os.PathLike) -> list[Path]:
    """Every link inside the output folder (the folder itself may be one: a scratch disk linked in), not followed."""
    found = []
    for root, dirs, files in os.walk(output_dir):
        found += [Path(root) / n for n in sorted(dirs + files) if os.path.islink(os.path.join(root, n))]
    return found


def open_nofollow(output_dir: str | os.PathLike, rel: str, flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """A descriptor for OUTPUT_DIR/rel, created if need be (its folders too), without following a link on the
    way below OUTPUT_DIR: a planted link is an OSError (ELOOP) naming it, never a write elsewhere."""
    path = Path(output_dir)
    path.mkdir(parents=True, exist_ok=True)
    parts = Path(rel).parts
    for part in parts[:-1]:
        path = path / part
        if path.is_symlink():
            raise OSError(
                errno.ELOOP, "a link inside the output folder: run files are not written through it", str(path)
            )
        path.mkdir(exist_ok=True)
    path = path / parts[-1]
    try:
        return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError(
                errno.ELOOP, "a link inside the output folder: run files are not written through it", str(path)
            ) from None
        raise


def torchrun_log(output_dir: str | os.PathLike) -> Path:
    """torchrun's own stderr (its tracebacks and notes): kept here, whole; the console gets the failure report."""
    return Path(output_dir) / LOG_DIR / "torchrun.log"


def write_atomic(path: str | os.PathLike, data: str | bytes, mode: int | None = None) -> Path:
    """Write `data` to `path` complete or not at all: a temporary file of this process's own in the same folder,
    flushed, then renamed over `path`. A link at `path` is replaced by the file, never written through (its target
    is left as it was); `mode` (default: the temporary file's 0600) is set before the rename. The one way files are
    rewritten, inside a run folder and outside it (output/files.py adds --force for files outside)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def new_file_mode() -> int:
    """The mode `open()` would give a new file here: 0666 less this process's umask (read from /proc, where the
    kernel says it, so no other thread sees the umask change that asking for it takes elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


class Unreadable(ValueError):
    """A file of a run folder that is not read: not a regular file (a FIFO, a device, a link to one), or larger
    than what fsdp-tune ever writes there. The message names the file; the reader makes it a finding."""


def read_bounded(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of `path`, a file fsdp-tune wrote into a run folder and reads back (`report`, the launcher): opened
    without blocking (a FIFO there would wait for a writer for ever), refused unless it is a regular file (a link
    to /dev/zero never ends), and never more than `limit` bytes read. FileNotFoundError when it is not there."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{path} is not a regular file (a FIFO, a device, or a link to one): not read")
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise Unreadable(f"{path} is larger than {limit >> 20} MiB, more than a run writes there: not read")
        return b"".join(chunks)
    finally:
        os.close(fd)
