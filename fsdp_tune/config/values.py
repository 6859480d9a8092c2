"""Values as the user wrote them -> typed values, by the kind and choices of their field.

"false" as a string is false, "yes please" is an error, never truthy; enums are matched without regard
to case. Shared by the normalizer and the flag parser (a bare boolean flag needs the field's kind).
"""

from __future__ import annotations

import difflib
import json
import math
import os
from dataclasses import MISSING
from typing import Any

from fsdp_tune.config import keys
from fsdp_tune.config.lora_fields import lora_fields
from fsdp_tune.config.methods import SFT, all_fields, flag_kind, methods_taking
from fsdp_tune.config.schema import attention_implementations, section_fields, training_fields

TRUE = {"true", "t", "yes", "y", "on", "1"}
FALSE = {"false", "f", "no", "n", "off", "0"}
# Paths read with `~` expanded as a shell would, once, here: every reader (the rank spec, the pre-flight, a resume's
# `latest`, an emitted job) and the manifest then see the same folder
HOME_PATHS = {"training.output_dir"}
# Enums whose values are upper-case by convention (accelerate accepts any case; we normalise).
UPPER_ENUMS = {"fsdp.auto_wrap_policy", "fsdp.state_dict_type", "fsdp.sharding_strategy", "fsdp.backward_prefetch"}


class BadValue(ValueError):
    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint  # a fix for this value (the closest valid one); value_hint() is the general one


def kind_of(path: str, method: str | None = None) -> str:
    """The kind of a setting's value; a training field's in `method`'s config, or as the flag parser reads it
    (config/methods.py flag_kind) when no method is given."""
    section, name = path.split(".", 1)
    if section == "training":
        spec = training_fields(method).get(name) if method else None
        return spec["kind"] if spec else flag_kind(name) if name in all_fields() else "any"
    if section == "peft":
        return lora_fields()[name]["kind"]
    f = section_fields(section)[name]
    if f.metadata.get("kind"):
        return f.metadata["kind"]
    if f.metadata.get("choices"):
        return "str"
    default = f.default if f.default is not MISSING else None
    return {bool: "bool", int: "int", float: "float", str: "str", tuple: "list"}.get(type(default), "any")


def choices_of(path: str, method: str | None = None) -> tuple[str, ...] | None:
    """The values a choice-valued field takes: our own fields' `choices`; for the method's TRL config fields
    (SFTConfig's without a method) and the attention implementation, the installed libraries' own enums
    (generated into training_fields.json)."""
    section, name = path.split(".", 1)
    if section == "training":
        spec = training_fields(method or SFT).get(name) or training_fields(_taking(name)).get(name) or {}
        return tuple(spec["choices"]) if spec.get("choices") else None
    if section == "peft":
        return None
    if path == "model.attn_implementation":
        return attention_implementations() or None
    return section_fields(section)[name].metadata.get("choices")


def _taking(name: str) -> str:
    """The first method whose config takes `name` (a field SFTConfig lacks, asked about without a method)."""
    taking = methods_taking(name)
    return taking[0] if taking else SFT


def _choice(path: str, text: str, choices: tuple[str, ...]) -> str:
    """`text` as one of `choices` (matched without regard to case), or BadValue with the closest one."""
    if path == "model.attn_implementation" and "/" in text:
        return text  # a Hub kernel (`kernels-community/flash-attn`): transformers loads it by name
    norm = text.upper() if path in UPPER_ENUMS else text.lower()
    if norm in choices:
        return norm
    closest = difflib.get_close_matches(norm, choices, n=1, cutoff=0.5)
    flag = path.split(".", 1)[1]
    if len(choices) <= 8:
        message = f"must be one of {', '.join(choices)}; got {text!r}"
    else:
        message = f"{text!r} is not one of the {len(choices)} values the installed libraries accept"
    where = f"`fsdp-tune flags {flag}` lists {'them' if len(choices) <= 8 else 'all of them'}"
    hint = f"--{flag} {closest[0]} (the closest); {where}" if closest else f"{where}"
    raise BadValue(message, hint)


def to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE | FALSE:
        return value.strip().lower() in TRUE
    raise BadValue(f"must be true or false, got {value!r}")


def to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise BadValue(f"must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BadValue(f"must be an integer, got {value!r}") from None
    if not number.is_integer():
        raise BadValue(f"must be an integer, got {value!r}")
    return int(number)


def to_float(value: Any) -> float:
    """A finite number: `nan` and `inf` (YAML's `.nan`, a flag's `nan`) would pass every range check
    (comparisons with NaN are false) and fail or diverge after launch."""
    if isinstance(value, bool):
        raise BadValue(f"must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BadValue(f"must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise BadValue(f"must be a finite number, got {value!r}")
    return number


def to_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(str(v).strip() for v in value)
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    raise BadValue(f"must be a list or a comma-separated string, got {value!r}")


def to_int_list(value: Any) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    return tuple(to_int(v) for v in to_list(value))


def to_bool_or_str(value: Any) -> bool | str:
    """init_lora_weights: true/false, or the name of an initialisation."""
    try:
        return to_bool(value)
    except BadValue:
        if isinstance(value, str) and value.strip():
            return value.strip().lower()
        raise BadValue(f"must be true, false or a name, got {value!r}") from None


def to_json(value: Any) -> Any:
    """A list or mapping as YAML gives it, or as a JSON string on the command line (a list of words stays a list)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            raise BadValue(f"must be JSON (a list or a mapping), got {value!r}") from None
        return [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(value, (list, tuple)):
        return [json.loads(v) if isinstance(v, str) and v.strip().lstrip("-").isdigit() else v for v in value]
    return value


def to_dict(value: Any) -> dict:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    raise BadValue(f"must be a mapping (or a JSON object string), got {value!r}")


def to_map(value: Any) -> dict[str, str]:
    """A mapping, a JSON object, or `key=value,key=value` (--dataset_columns prompt=question,completion=answer)."""
    if isinstance(value, str) and not value.strip().startswith("{"):
        pairs = [p.partition("=") for p in value.split(",") if p.strip()]
        if pairs and all(eq and k.strip() and v.strip() for k, eq, v in pairs):
            return {k.strip(): v.strip() for k, _, v in pairs}
        raise BadValue(f"must be key=value pairs separated by commas, got {value!r}")
    mapping = to_dict(value)
    if not all(isinstance(v, str) for v in mapping.values()):
        raise BadValue(f"must map names to names, got {value!r}")
    return {str(k): v for k, v in mapping.items()}


def to_files(value: Any) -> Any:
    """data_files as `datasets` takes them: a path, paths (a list or comma-separated), or {split: path(s)}."""
    if isinstance(value, dict):
        return {str(k): to_files(v) for k, v in value.items()}
    if isinstance(value, str) and value.strip().startswith("{"):
        return to_files(to_dict(value))
    files = to_list(value)
    return files[0] if len(files) == 1 else files


def to_records(value: Any) -> tuple[dict, ...]:
    """A list of mappings (a recipe's `datasets:`), or the same as JSON text; entries are checked by FT100."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise BadValue(f"must be a list of datasets (YAML, or JSON text), got {value!r}") from None
    if not isinstance(value, (list, tuple)):
        raise BadValue(f"must be a list of datasets, each with a `path`, got {value!r}")
    return tuple(dict(v) if isinstance(v, dict) else v for v in value)


def to_float_list(value: Any) -> tuple[float, ...]:
    """DPOConfig's loss_weights: numbers, as a list or comma-separated."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (to_float(value),)
    return tuple(to_float(v) for v in to_list(value))


def coerce(path: str, value: Any, method: str = SFT) -> Any:
    """`value` as the setting at `path` takes it; a training field as `method`'s TRL config takes it."""
    if value is None:
        return None
    if path == "launch.mixed_precision" and value is False:
        return "no"  # YAML reads an unquoted `no` as false
    if path == "fsdp.sharding_strategy":
        value = keys.STRATEGY_BY_NUMBER.get(str(value), value)
    kind = kind_of(path, method)
    if kind == "bool":
        return to_bool(value)
    if kind == "int":
        return to_int(value)
    if kind == "float":
        return to_float(value)
    if kind == "list":
        items = to_list(value)
        choices = choices_of(path, method)
        if choices:  # report_to, debug: each word one of the choices (TrainingArguments splits on spaces)
            words = [w for item in items for w in item.split()]
            return tuple(_choice(path, w, choices) for w in words)
        return items
    if kind == "dict":
        return to_dict(value)
    if kind in _KINDS:
        return _KINDS[kind](value)
    if kind == "str":
        if isinstance(value, (dict, list, bool)):
            raise BadValue(f"must be a string, got {value!r}")
        text = str(value).strip()
        if path in HOME_PATHS:
            return os.path.expanduser(text)  # a recipe's `output_dir: ~/runs/x`: never a folder named `~`
        choices = choices_of(path, method)
        return _choice(path, text, choices) if choices else text
    return value


def value_hint(path: str, method: str = SFT) -> str:
    choices = choices_of(path, method)
    if choices:
        return f"use one of: {', '.join(choices)}"
    kind = kind_of(path, method)
    return {
        "bool": "use true or false (a real boolean, not a sentence)",
        "int": "use a whole number",
        "float": "use a finite number",
        "list": "use a list, or a comma-separated string",
        "float_list": "use a list of numbers (or a comma-separated string of them)",
        "int_list": "use a list of whole numbers (or a comma-separated string of them)",
        "bool_or_str": "use true, false or the name of an initialisation",
        "json": "use a list or a mapping (JSON on the command line)",
        "dict": "use a mapping",
        "map": "use key=value pairs separated by commas (or a mapping)",
        "files": "use a path, several paths, or a mapping of split: path",
        "records": "use a list of mappings, each with a `path` (TRL's dataset mixture)",
    }.get(kind, "")


_KINDS = {
    "int_list": to_int_list,
    "float_list": to_float_list,
    "bool_or_str": to_bool_or_str,
    "json": to_json,
    "map": to_map,
    "files": to_files,
    "records": to_records,
}
