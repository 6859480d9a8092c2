"""Each rank's full output goes to OUTPUT_DIR/logs/rank-K.log; the console shows rank 0 only."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO


class _Tee:
    def __init__(self, stream: TextIO | None, log: TextIO):
        self.stream = stream
        self.log = log

    def write(self, text: str) -> int:
        if self.stream is not None:
            try:
                self.stream.write(text)
            except (BrokenPipeError, ValueError):
                self._console_gone()
        self.log.write(text)
        return len(text)

    def flush(self) -> None:
        if self.stream is not None:
            try:
                self.stream.flush()
            except (BrokenPipeError, ValueError):
                self._console_gone()
        self.log.flush()

    def _console_gone(self) -> None:
        """The console's reader left (`fsdp-tune train | head`): the log keeps everything, the rank runs on.
        Its descriptor now points at /dev/null, so nothing else writing there (or a flush at exit) fails."""
        try:
            fd = self.stream.fileno() if self.stream is not None else -1
        except (OSError, ValueError):
            fd = -1
        self.stream = None
        if fd >= 0:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)

    def isatty(self) -> bool:
        return bool(self.stream is not None and self.stream.isatty())

    def fileno(self) -> int:
        return self.log.fileno() if self.stream is None else self.stream.fileno()


def setup_rank_log(output_dir: str, rank: int) -> Path:
    """Tee stdout/stderr into the rank's log; ranks other than 0 stay off the console."""
    path = Path(output_dir) / "logs" / f"rank-{rank}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    quiet = rank != 0 and os.environ.get("FSDP_TUNE_ALL_RANKS_TO_CONSOLE") != "1"
    sys.stdout = _Tee(None if quiet else sys.__stdout__, log)  # type: ignore[assignment]
    sys.stderr = _Tee(None if quiet else sys.__stderr__, log)  # type: ignore[assignment]
    return path
