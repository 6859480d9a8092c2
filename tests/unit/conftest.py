"""The unit layer never imports torch or the HF stack: that is the launcher side's promise. And the stand-in
for torchrun and the ranks that drives `train` through its launcher path (tests/unit/fake_ranks.py)."""

from __future__ import annotations

import sys

import pytest

from fsdp_tune.launch import torchrun
from fsdp_tune.preflight import tokens as tokencheck
from tests.unit.fake_ranks import FakeRanks

HEAVY = ("torch", "transformers", "accelerate", "peft", "trl", "bitsandbytes", "datasets")


@pytest.fixture(autouse=True, scope="module")
def _no_heavy_imports():
    before = {m for m in HEAVY if m in sys.modules}  # tests/dist may have run first in this process
    yield
    heavy = [m for m in HEAVY if m in sys.modules and m not in before]
    assert not heavy, f"a unit test imported {heavy}; move it to tests/dist or keep the import lazy"


@pytest.fixture(autouse=True)
def _no_launcher_tokenizer(monkeypatch):
    """train's pre-flight tokenizes the rows with transformers' tokenizer (preflight/tokens.py): not in this
    layer; tests/lib tests it."""
    monkeypatch.setattr(tokencheck, "load_tokenizer", lambda model: (None, "not loaded in the unit tests"))


@pytest.fixture
def fake_ranks(monkeypatch) -> FakeRanks:
    """torchrun and the ranks, stood in for: `train` runs its whole launcher path, the "ranks" write what
    real ones would (queue what each launch does with fake_ranks.next(...))."""
    fake = FakeRanks()
    monkeypatch.setattr(torchrun, "run", fake)
    monkeypatch.setattr(torchrun, "materialize_model", lambda spec: spec)
    monkeypatch.setattr("fsdp_tune.cli.run_cmds._plot", lambda output_dir: None)  # matplotlib: not here
    return fake
