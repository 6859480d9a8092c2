"""Stop requests inside a rank: every signal a scheduler may send for "stop soon", counted once.

A rank can be asked to stop by the launcher's stop file, by a signal to the rank itself (a scheduler that
signals every process of the job: `scancel`, `srun`, SLURM's `--signal=USR1@T`), and by torchrun, which
forwards what it receives. One preemption therefore often arrives two or three times within milliseconds:
every signal within SAME_REQUEST_S of the first is that same request (finish the step, checkpoint, stop).
Only a later one is somebody asking again, and it stops the rank at once (KeyboardInterrupt).

Installed first thing in the rank (worker/__main__.py), so a signal during start-up is kept and honoured at
the first step end rather than killing the rank. No torch here: unit tests drive it with a fake clock.
"""

from __future__ import annotations

import signal
import time

from fsdp_tune.worker.logs import console
from fsdp_tune.worker.rank import rank

# SIGHUP: a hang-up (terminal, some schedulers); SIGUSR1: SLURM's --signal=USR1@SECONDS before the time limit
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
SAME_REQUEST_S = 3.0


class StopRequest:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.signum: int | None = None  # the first signal: the request
        self.first_at = 0.0

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self) -> StopRequest:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.on_signal)
        return self

    def on_signal(self, signum: int, _frame=None) -> None:
        now = self.clock()
        if self.signum is None:
            self.signum, self.first_at = signum, now
            _note(f"{signal.Signals(signum).name}: stopping after this step (with a checkpoint when they are on)")
            return
        if now - self.first_at < SAME_REQUEST_S:
            return  # the same request, delivered again (torchrun's forward, the scheduler's own)
        _note(f"{signal.Signals(signum).name} again: stopping at once")
        raise KeyboardInterrupt


_current: StopRequest | None = None


def current() -> StopRequest:
    """This process's stop request, installed on first use (from the main thread)."""
    global _current
    if _current is None:
        _current = StopRequest().install()
    return _current


def _note(text: str) -> None:
    try:
        console().line(f"fsdp-tune: rank {rank()}: {text}", err=True)
    except (OSError, ValueError, RuntimeError):  # RuntimeError: the signal came inside a write to stderr
        pass
