"""Regenerate fsdp_tune/config/training_fields.json from the installed TRL.

The launcher must not import trl/transformers (validate-config answers in a blink), so the names,
kinds and defaults of every SFTConfig field are kept as data, and so are the values a choice-valued field
takes, read from the libraries' own enums and `choices` metadata (schedulers, optimizers, strategies,
`report_to`'s integrations, `debug`, the attention implementations transformers registers).
tests/lib/test_worker_pieces.py fails when the installed libraries drift from this table; run this script then.
"""

from __future__ import annotations

import dataclasses
import enum
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


def _enum_values(tp: object) -> list[str] | None:
    """The values of the first Enum (or Literal of strings) inside an annotation, list[...] included."""
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return [str(m.value) for m in tp]
    if typing.get_origin(tp) is typing.Literal:
        args = typing.get_args(tp)
        return [a for a in args if isinstance(a, str)] or None
    for arg in typing.get_args(tp):
        found = _enum_values(arg)
        if found:
            return found
    return None


def _extra_choices() -> dict[str, list[str]]:
    """Choice-valued fields whose values are not an Enum in the annotation: the libraries' own registries."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    choices = {"report_to": [*INTEGRATION_TO_CALLBACK, "all", "none"]}
    try:  # torch.compile's modes, as torch lists them
        import torch._inductor

        choices["torch_compile_mode"] = list(torch._inductor.list_mode_options())
    except (ImportError, AttributeError):
        pass
    return choices


def _choices(f: dataclasses.Field, tp: object, extra: dict[str, list[str]]) -> list[str] | None:
    if f.name in extra:
        values = extra[f.name]
    elif f.metadata.get("choices"):
        values = [str(v) for v in f.metadata["choices"]]
    else:
        values = _enum_values(tp)
    return sorted(set(values)) if values else None


def attention_implementations() -> list[str]:
    """What `attn_implementation` may name (besides a Hub kernel `org/repo`): transformers'
    get_correct_attn_implementation accepts "eager" and every key of its AttentionInterface."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return sorted({"eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()})


def build() -> dict:
    import transformers
    import trl
    from trl import SFTConfig

    hints = typing.get_type_hints(SFTConfig)
    extra = _extra_choices()
    fields = {}
    for f in dataclasses.fields(SFTConfig):
        if not f.init or f.name.startswith("_"):
            continue
        tp = hints.get(f.name, str)
        fields[f.name] = {"kind": _kind(tp), "default": _default(f)}
        choices = _choices(f, tp, extra)
        if choices:
            fields[f.name]["choices"] = choices
    return {
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "fields": dict(sorted(fields.items())),
        "attn_implementation": attention_implementations(),
    }


if __name__ == "__main__":
    data = build()
    if "--check" in sys.argv:
        current = json.loads(OUT.read_text())
        sys.exit(0 if current == data else 1)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {len(data['fields'])} fields to {OUT}")
