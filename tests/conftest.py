"""Shared test helpers. Tests run offline: nothing may reach a model or dataset hub."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.seeds import seed_flags  # noqa: F401 - re-exported for the tests

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# Real-world Accelerate configs from other projects (copied from ../shared/peer-configs: CI runs them)
PEER_CONFIGS = FIXTURES / "peer-configs"


@pytest.fixture
def repo() -> Path:
    return REPO


def checked_spec(*flags: str, machine=None, config: str | None = None):
    """(the rank spec `train` decides for a config and flags on `machine`, the check it came from); this
    machine's CPU when no machine is given. A launch with errors is refused, as `train` refuses it."""
    from fsdp_tune.launch.decide import decide
    from fsdp_tune.launch.machine import Machine
    from fsdp_tune.validate import check

    checked = check(config, list(flags))
    assert not checked.errors, checked.findings
    return decide(checked.config, machine or Machine.cpu_only()), checked


def spec_for(*flags: str, machine=None, config: str | None = None):
    """The rank spec `train` decides (checked_spec, without the check)."""
    return checked_spec(*flags, machine=machine, config=config)[0]
