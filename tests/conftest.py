"""Shared test helpers. Tests run offline: nothing may reach a model or dataset hub."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
SHARED = REPO.parent / "shared"


def seed_flags(script: str) -> tuple[str, list[str]]:
    """The config path and the flags that a seed script passes to `fsdp-tune train`, parsed from the script."""
    import shlex

    text = (REPO / "scripts" / script).read_text()
    body = text[text.index("exec ") :].replace("\\\n", " ")
    words = shlex.split(body.split("\n", 1)[0])
    words = [w for w in words if w != "$@"]
    i = words.index("--config")
    return words[i + 1], words[i + 2 :]


@pytest.fixture
def repo() -> Path:
    return REPO
