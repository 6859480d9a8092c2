"""The seed launches as data: the config and flags each `scripts/run_peft_*.sh` passes to `fsdp-tune train`."""

from __future__ import annotations

import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # tests/seeds.py


def seed_flags(script: str) -> tuple[str, list[str]]:
    """The config path and the flags that a seed script passes to `fsdp-tune train`, parsed from the script."""
    text = (REPO / "scripts" / script).read_text()
    body = text[text.index("exec ") :].replace("\\\n", " ")
    words = shlex.split(body.split("\n", 1)[0])
    words = [w for w in words if w != "$@"]
    i = words.index("--config")
    return words[i + 1], words[i + 2 :]
