"""The unit layer never imports torch or the HF stack: that is the launcher side's promise (tests/unit/guard.py
holds it, in any order of the layers in one pytest process). And the stand-in for torchrun and the ranks that
drives `train` through its launcher path (tests/unit/fake_ranks.py)."""

from __future__ import annotations

import pytest

from fsdp_tune.launch import torchrun
from fsdp_tune.preflight import tokens as tokencheck
from tests.unit.fake_ranks import FakeRanks
from tests.unit.guard import heavy_globals, no_heavy_imports


def pytest_collection_modifyitems(config, items) -> None:
    """A unit test module that imports a heavy package at its top is refused at collection."""
    for module in {item.module for item in items if hasattr(item, "module")}:
        if "tests/unit/" in module.__file__.replace("\\", "/") and (heavy := heavy_globals(module)):
            raise pytest.UsageError(f"{module.__name__} imports {heavy}: not in the unit layer")


@pytest.fixture(autouse=True, scope="module")
def _no_heavy_imports():
    """Once per test module (taking the stack out of sys.modules costs ~10 ms with it loaded); the refused
    import itself fails in the test that tried it."""
    with no_heavy_imports() as attempts:
        yield
    assert not attempts, f"a unit test imported {attempts}; move it to tests/lib or keep the import lazy"


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
