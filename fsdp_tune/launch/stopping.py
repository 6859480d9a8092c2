"""Stop requests on the launcher side: the signals schedulers and people send, and what each one means.

Schedulers deliver a stop in more than one way: a terminal's Ctrl-C or `kill` reaches only fsdp-tune;
`scancel`/`srun` (and SLURM's `--signal=USR1@T`) signal fsdp-tune, torchrun and the ranks at once, and srun
may forward the same signal again; torchrun forwards what it receives to the ranks. So every signal that
arrives within SAME_REQUEST_S of the first is the same request: finish the step, checkpoint, stop. Only a
signal later than that is a person asking again, and it stops at once: torchrun and the ranks are killed
(SIGKILL), because a rank stuck in a collective runs no signal handler and torchrun would wait its whole
shutdown timeout for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from fsdp_tune.runfiles import write_atomic

# SIGHUP: the terminal went away; SIGUSR1: SLURM's --signal=USR1@SECONDS warning before the time limit
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
SAME_REQUEST_S = 3.0
# torchrun forwards these to the ranks (its default list lacks SIGUSR1, which would kill torchrun outright)
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


class StopRelay:
    """The launcher's handler for STOP_SIGNALS while torchrun (process `pid`, once started) runs."""

    def __init__(self, stop_file: Path, clock=time.monotonic, pid: int | None = None):
        self.pid = pid
        self.stop_file = stop_file
        self.clock = clock
        self.signal: int | None = None  # the first one: what the run was stopped by
        self.first_at = 0.0
        self.killed = False
        self._previous: dict[int, object] = {}

    def install(self) -> StopRelay:
        self._previous = {s: signal.signal(s, self.on_signal) for s in STOP_SIGNALS}
        return self

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def on_signal(self, signum: int, _frame=None) -> None:
        now = self.clock()
        if self.signal is None:
            self.signal, self.first_at = signum, now
            _say(
                f"\nfsdp-tune: {signal.Signals(signum).name}: finishing the current step and saving a checkpoint; "
                f"a signal again ({SAME_REQUEST_S:g} s or more from now) stops at once"
            )
            with contextlib.suppress(OSError):
                write_atomic(self.stop_file, str(signum))  # replaced whole, never written through a planted link
        elif now - self.first_at >= SAME_REQUEST_S and not self.killed and self.pid is not None:
            self.killed = True
            _say(f"\nfsdp-tune: {signal.Signals(signum).name} again: stopping at once (no checkpoint)")
            kill_now(self.pid)


def kill_now(pid: int) -> None:
    """SIGKILL torchrun (`pid`, leader of its own session) first, so it cannot restart anything, then each
    rank's process group (the ranks lead sessions of their own, with their data-loader workers)."""
    ranks = children(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in ranks:
        try:
            os.killpg(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)


def children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (Linux; elsewhere none are found)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(stat.parent.name))
    return found


def _say(text: str) -> None:
    with contextlib.suppress(OSError, ValueError, RuntimeError):  # RuntimeError: a signal inside a write
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
