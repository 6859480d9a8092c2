"""Atomic file writes that stay safe when several launchers share one output folder.

A multi-node job often writes to a shared filesystem (NFS, Lustre): every node's launcher sees the same
OUTPUT_DIR, so a fixed `name.tmp` would be written and renamed by two processes at once.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` complete or not at all; the temporary file is this process's own."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
