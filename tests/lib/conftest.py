"""The library layer runs many tests in one process: accelerate keeps process-wide state (AcceleratorState and
PartialState share theirs across instances, GradientState too), so a test that built an Accelerator would decide
the next test's distributed type. Each test starts from accelerate's fresh state, as each rank does."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    yield
    if "accelerate.state" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
