"""Regenerate fsdp_tune/config/lora_fields.json and model_config_fields.json from the installed PEFT and TRL.

The launcher must not import peft/trl (validate-config answers in a blink), so PEFT's `LoraConfig` fields,
TRL's `ModelConfig` fields (name, kind, default), PEFT's table of the MoE models whose experts it adapts
through parameter targeting and its default LoRA targets per model type are kept as data, like the SFTConfig
table (scripts/gen_training_fields.py).
`--check` exits 1 when the installed libraries drift from the tables (tests/lib/test_worker_pieces.py runs it).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import types
import typing
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "fsdp_tune" / "config"
LORA_OUT = CONFIG / "lora_fields.json"
MODEL_OUT = CONFIG / "model_config_fields.json"


def _union_kind(kinds: set[str]) -> str:
    if len(kinds) == 1:
        return kinds.pop()
    for pair, kind in (({"str", "list"}, "list"), ({"int", "int_list"}, "int_list"), ({"bool", "str"}, "bool_or_str")):
        if kinds == pair:
            return kind
    return "dict" if kinds == {"dict"} else "json"


def _kind(tp: object) -> str:
    """The kinds a value on the command line or in a recipe is coerced into (config/values.py)."""
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):
        return _union_kind({_kind(a) for a in args})
    if origin is typing.Literal:
        return "str"
    if origin is list:
        return {str: "list", int: "int_list"}.get(args[0] if args else None, "json")
    if origin is dict or tp is dict or dataclasses.is_dataclass(tp):
        return "dict"
    for py, kind in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if tp is py:
            return kind
    if isinstance(tp, type) and issubclass(tp, str):  # str enums (TaskType)
        return "str"
    return "json"


def _default(f: dataclasses.Field) -> object:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return None
    if isinstance(value, enum.Enum):
        value = value.value
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def _fields(cls: type) -> dict:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.init and not f.name.startswith("_"):
            out[f.name] = {"kind": _kind(hints.get(f.name, str)), "default": _default(f)}
    return out


def _moe() -> dict:
    """PEFT's MoE conversion tables: model_type -> family, and per family the pre-fusion target names mapped to
    the fused parameters (experts) or the router, and which names were fused (their rank doubles)."""
    from peft.utils import transformers_weight_conversion as conv

    targets = conv._MOE_TARGET_MODULE_MAPPING
    return {
        "model_types": {k: v for k, v in sorted(conv._MODEL_TO_CONVERSION_PATTERN.items()) if v in targets},
        "targets": targets,
        "fused": conv._MOE_FUSED_TARGETS,
    }


def build() -> tuple[dict, dict]:
    import peft
    import trl
    from peft import LoraConfig
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as default_targets
    from trl import ModelConfig

    lora = {"peft_version": peft.__version__, "fields": _fields(LoraConfig), "moe": _moe()}
    # what LoraConfig(target_modules=None) adapts per model_type (TRL's --use_peft without --lora_target_modules)
    lora["default_targets"] = {k: list(v) for k, v in sorted(default_targets.items())}
    model = {"trl_version": trl.__version__, "fields": _fields(ModelConfig)}
    return lora, model


if __name__ == "__main__":
    lora, model = build()
    if "--check" in sys.argv:
        same = json.loads(LORA_OUT.read_text()) == lora and json.loads(MODEL_OUT.read_text()) == model
        sys.exit(0 if same else 1)
    LORA_OUT.write_text(json.dumps(lora, indent=1) + "\n")
    MODEL_OUT.write_text(json.dumps(model, indent=1) + "\n")
    print(f"wrote {len(lora['fields'])} LoraConfig fields to {LORA_OUT}")
    print(f"wrote {len(model['fields'])} ModelConfig fields to {MODEL_OUT}")
