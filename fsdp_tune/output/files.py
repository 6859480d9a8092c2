"""The writer door for files written outside a run folder: `train --emit KIND -o FILE`, `report -o FILE` (and its
loss.png for several runs), `convert -o FILE`. A run folder's own files are runfiles.write_atomic's alone.

What it guarantees, whatever the command:
- an existing file is replaced only with --force (the wording `merge` and `convert` use);
- a link at FILE is never followed: without --force it is refused like a file, with --force the link itself is
  replaced by the new file and its target is left as it was (never opened, never truncated);
- a folder, a FIFO, a device or a socket at FILE is refused, --force or not (`-o /dev/null --force` must not
  replace a device node with a file);
- the write is atomic (runfiles.write_atomic: a temporary file in the same folder, renamed over FILE): a reader
  sees the old file or the new one, never half of it; a file it replaces keeps its mode, a new one gets the
  mode `open()` would give it (0666 less the umask);
- a write that fails (no such folder, no permission, a full disk) is an exit 2 naming FILE, not an internal error.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fsdp_tune.errors import UsageError
from fsdp_tune.runfiles import new_file_mode, write_atomic


def write_out(path: str | os.PathLike, data: str | bytes, force: bool, flag: str = "-o") -> Path:
    """Write `data` to `path` (given as `flag`) through the door's rules above; returns the path written."""
    path = Path(path)
    mode = _mode_to_replace(path, force, flag)
    if not path.parent.is_dir():
        raise UsageError(
            f"{flag} {path}: there is no folder {path.parent}", f"create it first (mkdir -p {path.parent})"
        )
    try:
        return write_atomic(path, data, mode)
    except OSError as err:
        raise UsageError(
            f"{flag} {path} cannot be written ({err.strerror or err})", "choose a folder you can write to"
        ) from None


def _mode_to_replace(path: Path, force: bool, flag: str) -> int:
    """The mode the written file gets, once `path` may be written: refused (UsageError) when it may not."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return new_file_mode()
    except OSError as err:
        raise UsageError(f"{flag} {path} cannot be written ({err.strerror or err})", "choose another file") from None
    if stat.S_ISLNK(st.st_mode):
        if not force:
            raise UsageError(
                f"{path} exists (a link to {os.readlink(path)}); not overwritten",
                "pass --force to replace the link itself with the file (its target is left as it is), or "
                f"{flag} OTHER_FILE",
            )
        return new_file_mode()
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{flag} {path} is a folder", f"name a file: {flag} {path / 'NAME'}")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(
            f"{flag} {path} is not a regular file (a FIFO, device or socket); not replaced, even with --force",
            f"{flag} OTHER_FILE",
        )
    if not force:
        raise UsageError(f"{path} exists; not overwritten", f"pass --force to replace it, or {flag} OTHER_FILE")
    return stat.S_IMODE(st.st_mode)
