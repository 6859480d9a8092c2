"""The unit layer never imports torch or the HF stack: that is the launcher side's promise."""

from __future__ import annotations

import sys

import pytest

HEAVY = ("torch", "transformers", "accelerate", "peft", "trl", "bitsandbytes", "datasets")


@pytest.fixture(autouse=True, scope="module")
def _no_heavy_imports():
    before = {m for m in HEAVY if m in sys.modules}  # tests/dist may have run first in this process
    yield
    heavy = [m for m in HEAVY if m in sys.modules and m not in before]
    assert not heavy, f"a unit test imported {heavy}; move it to tests/dist or keep the import lazy"
