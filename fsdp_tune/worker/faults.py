"""Test-only fault injection, in one place: production code asks this module, tests set the variables.

FSDP_TUNE_TEST_KILL="RANK:STEP"   SIGKILL that rank at the end of that step (first torchrun attempt only)
FSDP_TUNE_TEST_HANG="RANK:STEP"   make that rank stop responding there instead
FSDP_TUNE_TEST_POISON_STEP=N      the loss of step N becomes NaN (the NaN guard's test)
Nothing here acts unless one of these is set.
"""

from __future__ import annotations

import os
import signal
import time

from transformers import TrainerCallback

KILL, HANG, POISON = "FSDP_TUNE_TEST_KILL", "FSDP_TUNE_TEST_HANG", "FSDP_TUNE_TEST_POISON_STEP"


def callbacks() -> list[TrainerCallback]:
    return [FaultInjectionCallback()] if os.environ.get(KILL) or os.environ.get(HANG) else []


def poison_loss(loss, next_step: int):
    """NaN instead of the loss at the step FSDP_TUNE_TEST_POISON_STEP names; the loss itself otherwise."""
    wanted = os.environ.get(POISON)
    if wanted and int(wanted) == next_step:
        return loss * float("nan")
    return loss


class FaultInjectionCallback(TrainerCallback):
    def __init__(self):
        self.kill = self._spec(KILL)
        self.hang = self._spec(HANG)

    @staticmethod
    def _spec(name: str) -> tuple[int, int]:
        spec = os.environ.get(name, "")
        rank, step = spec.split(":") if spec else (-1, -1)
        return int(rank), int(step)

    def on_step_end(self, args, state, control, **kwargs):
        here = (int(os.environ.get("RANK", 0)), state.global_step)
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return
        if here == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if here == self.hang:
            time.sleep(3600)
