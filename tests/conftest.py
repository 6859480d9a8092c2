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
