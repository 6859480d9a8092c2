"""Each rank's streams. Everything a rank and its libraries print goes, whole, to OUTPUT_DIR/logs/rank-K.log;
the console gets what fsdp-tune writes for people through `console()` (rank 0: phases, the progress line,
evaluation results, its own warnings and errors), and with --verbose everything rank 0 prints besides. Both pass
the console door's `printable` (fsdp_tune/printable.py): control characters in a value come out escaped.

The rank's stdout and stderr descriptors (1 and 2) are pointed at its log, so native code (gloo, NCCL, C++
warnings) lands there too; the console's own descriptors are kept aside for `console()` and, with
--verbose, for a copy of what Python code prints (native output then stays in the log only).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TextIO

from fsdp_tune.printable import printable
from fsdp_tune.runfiles import open_nofollow, rank_log
from fsdp_tune.worker import rank as ranks


class _Tee:
    def __init__(self, stream: TextIO | None, log: TextIO):
        self.stream = stream
        self.log = log

    def write(self, text: str) -> int:
        if self.stream is not None:
            try:
                self.stream.write(printable(text, keep="\n\t\r"))  # --verbose: progress bars redraw with \r
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


class Console:
    """What people see of a rank: lines on the console's stdout or stderr, each also written to the log,
    and on a terminal one status line redrawn in place (`status`). A console whose reader left is dropped;
    the log keeps everything."""

    def __init__(self, out: TextIO | None, err: TextIO | None, log: TextIO | None, live: bool = False):
        self.out, self.err, self.log, self.live = out, err, log, live
        self.echoes_output = False  # --verbose: the rank's own output reaches the console already
        self._status = ""

    def line(self, text: str, err: bool = False) -> None:
        text = printable(text)  # the console door's escapes: a row, a name or a path is shown, not obeyed
        self._clear_status()
        self._write("err" if err else "out", text + "\n")
        if self.log is not None:
            self.log.write(text + "\n")
            self.log.flush()
        self._write("out", self._status and "\r" + self._status)

    def status(self, text: str) -> None:
        """The live line (a terminal only): redrawn over the previous one."""
        if not self.live:
            return
        text = printable(text, keep="")  # one line, redrawn with our own \r
        pad = " " * max(0, len(self._status) - len(text))
        self._status = text
        self._write("out", f"\r{text}{pad}")

    def end_status(self) -> None:
        """Leave the live line where it is and move on below it."""
        if self._status:
            self._status = ""
            self._write("out", "\n")

    def show_error(self, text: str) -> None:
        """A rank is failing: the live line is left where it is. The traceback itself goes to the log (Python
        prints it there); the console gets the launcher's failure report (root cause, the frames that matter,
        the log's name) instead of every rank's whole traceback. --verbose shows it as Python prints it."""
        if not self.echoes_output:
            self.end_status()

    def _clear_status(self) -> None:
        if self._status:
            self._write("out", "\r" + " " * len(self._status) + "\r")

    def _write(self, which: str, text: str) -> None:
        stream = getattr(self, which)
        if stream is None or not text:
            return
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # BrokenPipeError: `fsdp-tune train | head` has exited
            setattr(self, which, None)


_console: Console | None = None
_log_path: Path | None = None


def console() -> Console:
    """This rank's console; outside a rank (a test, a spec run by hand) plain stdout/stderr."""
    return _console if _console is not None else Console(sys.stdout, sys.stderr, None)


def _console_stream(fd: int) -> TextIO:
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace")


def setup_rank_log(output_dir: str, rank: int, mode: str = "verbose") -> Path:
    """Send the rank's output to its log; `mode` is RankSpec.console. Ranks other than 0 show nothing on the
    console (FSDP_TUNE_ALL_RANKS_TO_CONSOLE=1: every rank shows what rank 0 does). Done once per process:
    the entry point does it before torch is imported, the recipe's setup() then finds it done."""
    global _console, _log_path
    path = rank_log(output_dir, rank)
    if _log_path == path:
        return path
    fd = open_nofollow(output_dir, path.relative_to(output_dir).as_posix())  # never through a planted link
    log = os.fdopen(fd, "a", buffering=1, encoding="utf-8")
    shown = rank == 0 or os.environ.get("FSDP_TUNE_ALL_RANKS_TO_CONSOLE") == "1"
    out, err = (_console_stream(1), _console_stream(2)) if shown else (None, None)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(log.fileno(), 1)  # native output (gloo, NCCL, C++ warnings): the log, in every mode
    os.dup2(log.fileno(), 2)
    verbose = mode == "verbose" and shown
    sys.stdout = _Tee(out if verbose else None, log)  # type: ignore[assignment]
    sys.stderr = _Tee(err if verbose else None, log)  # type: ignore[assignment]
    _console = Console(out, err, log, live=mode == "live" and out is not None and out.isatty())
    _console.echoes_output = verbose
    _log_path = path
    return path


def setup_from_spec(resolved_path: str) -> None:
    """The rank log, as early as the entry point can: the rank spec read as plain JSON (no torch yet), so
    what the imports print (bitsandbytes' backend notes) lands in the log too. A spec that cannot be read
    is left to the recipe, which reports it."""
    try:
        spec = json.loads(Path(resolved_path).read_text())["spec"]
        setup_rank_log(spec["trainer_args"]["output_dir"], ranks.rank(), spec.get("console", "lines"))
    except (OSError, ValueError, KeyError, TypeError):
        return
