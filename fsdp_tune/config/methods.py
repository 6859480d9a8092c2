"""The training methods' registry as the launcher reads it: each method's row (fsdp_tune/methods/: one entry per
method, listed in its __init__), and its TRL config's fields (training_fields.json: scripts/gen_training_fields.py
writes SFTConfig's whole and each other method's config as it differs from it). Everything the launcher, the rules,
the planner, the trace, the console and `report` need to know about a method is its row's, so none of them branches
on its name; tests/unit/test_method_rows.py walks every row to the rank.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from fsdp_tune.methods.registry import rows
from fsdp_tune.methods.row import DataKind, Head, MethodRow, Metric, Refused, Settings, Step, Truncation

__all__ = ["DataKind", "Head", "MethodRow", "Metric", "Refused", "Settings", "Step", "Truncation"]

ROWS: dict[str, MethodRow] = rows()
METHODS = tuple(ROWS)
SFT = METHODS[0]  # the default method (its row names SFTConfig, whose fields the others' are told apart from)


def row_of(method: str) -> MethodRow:
    """The method's row (SFT's for a name no row has: the config's choices refuse it first, FT010)."""
    return ROWS.get(method, ROWS[SFT])


def metric_keys(row: MethodRow, logged) -> list[tuple[str, str]]:
    """(key, label) of the row's metrics among the keys `logged`; a `*` in a key once for each logged key it
    matches, `{}` in its label the matched name (GRPO's rewards/NAME/mean, one per reward function). A matched name
    that is another metric's label (a reward function called `reward`, beside the total) is labelled by its key."""
    out = []
    taken = {m.label for m in row.metrics if "*" not in m.key}
    for m in row.metrics:
        if "*" not in m.key:
            out += [(m.key, m.label)] if m.key in logged else []
            continue
        head, _, tail = m.key.partition("*")
        found = (k for k in logged if k.startswith(head) and k.endswith(tail) and len(k) > len(head) + len(tail))
        labels = ((k, m.label.format(k[len(head) : len(k) - len(tail)])) for k in sorted(found))
        out += [(k, k if label in taken else label) for k, label in labels]
    return out


@cache
def table() -> dict[str, Any]:
    text = resources.files("fsdp_tune.config").joinpath("training_fields.json").read_text()
    return json.loads(text)


@cache
def fields_of(method: str = SFT) -> dict[str, dict[str, Any]]:
    """The method's config fields: name -> {"kind", "default", "choices"?}."""
    sft = table()["fields"]
    own = table()["methods"].get(method)  # none for SFTConfig itself (the default method), or an unknown name
    if own is None:
        return sft
    absent = set(own["absent"])
    return {**{k: v for k, v in sft.items() if k not in absent}, **own["fields"]}


@cache
def all_fields() -> frozenset[str]:
    """Every field some method's config takes: each is a flag (a method that lacks it refuses it, FT110)."""
    return frozenset(name for method in METHODS for name in fields_of(method))


def methods_taking(name: str) -> tuple[str, ...]:
    """The methods whose config has field `name`."""
    return tuple(m for m in METHODS if name in fields_of(m))


@cache
def flag_kind(name: str) -> str:
    """The kind the flag parser reads a training field's words as: a list when some method's config takes a
    list (`--loss_type sigmoid sft` is DPO's), else its kind where the configs agree, else 'any'."""
    kinds = {fields_of(m)[name]["kind"] for m in methods_taking(name)}
    for kind in ("list", "float_list"):
        if kind in kinds:
            return kind
    return kinds.pop() if len(kinds) == 1 else "any"


def f_divergence_losses() -> tuple[str, ...]:
    """DPO's loss types that take a non-default f_divergence_type (read from DPOConfig's help text: the config
    table that holds them)."""
    tables = table()["methods"].values()
    return tuple(next((t["f_divergence_losses"] for t in tables if "f_divergence_losses" in t), ()))
