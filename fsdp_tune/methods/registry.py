"""The list of method entries (one line: a name per entry, the first the default) and their rows."""

from __future__ import annotations

from importlib import import_module

from fsdp_tune.methods.row import MethodRow

ENTRIES = ("sft", "dpo", "kto", "reward", "grpo", "rloo")


def rows() -> dict[str, MethodRow]:
    """Every entry's row, by its name, in ENTRIES' order."""
    found = {}
    for name in ENTRIES:
        row = import_module(f"fsdp_tune.methods.{name}").ROW
        if row.name != name:
            raise ValueError(f"fsdp_tune/methods/{name}.py holds the row of {row.name!r}")
        found[name] = row
    return found
