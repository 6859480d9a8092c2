"""Regenerate fsdp_tune/config/training_fields.json from the installed TRL.

The launcher must not import trl/transformers (validate-config answers in a blink), so the names,
kinds and defaults of every SFTConfig field are kept as data. tests/lib/test_worker_pieces.py
fails when the installed TRL drifts from this table; run this script then.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "fsdp_tune" / "config" / "training_fields.json"


def _kind(tp: object) -> str:
    """Collapse a field annotation to the kinds a command-line value can be parsed into."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        kinds = {_kind(a) for a in args}
        for k in ("bool", "int", "float"):
            if kinds == {k}:
                return k
        if "list" in kinds:
            return "list"
        if "dict" in kinds:
            return "dict"
        if kinds <= {"str", "enum"}:
            return "str"
        if kinds == {"float", "int"}:
            return "float"
        return "str" if "str" in kinds else "any"
    if origin in (list, tuple):
        return "list"
    if origin is dict:
        return "dict"
    if tp is bool:
        return "bool"
    if tp is int:
        return "int"
    if tp is float:
        return "float"
    if tp is str:
        return "str"
    if isinstance(tp, type) and issubclass(tp, str):  # ExplicitEnum subclasses str
        return "str"
    if typing.get_origin(tp) is typing.Literal:
        return "str"
    return "any"


def _default(f: dataclasses.Field) -> object:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return None
    if hasattr(value, "value"):  # enums
        value = value.value
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def build() -> dict:
    import trl
    from trl import SFTConfig

    hints = typing.get_type_hints(SFTConfig)
    fields = {}
    for f in dataclasses.fields(SFTConfig):
        if not f.init or f.name.startswith("_"):
            continue
        fields[f.name] = {"kind": _kind(hints.get(f.name, str)), "default": _default(f)}
    return {"trl_version": trl.__version__, "fields": dict(sorted(fields.items()))}


if __name__ == "__main__":
    data = build()
    if "--check" in sys.argv:
        current = json.loads(OUT.read_text())
        sys.exit(0 if current == data else 1)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {len(data['fields'])} fields to {OUT}")
