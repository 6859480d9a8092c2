"""Coerce raw assignments into the typed RunConfig, with a finding for every value that cannot be.

Later assignments win (defaults < config file < flags). Values are coerced by the kind of their field
(bool, int, float, str, list, dict) and checked against its `choices`; "false" as a string is false,
"yes please" is an error, never truthy.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, replace
from typing import Any

from fsdp_tune.config import keys
from fsdp_tune.config.readers import Assignment
from fsdp_tune.config.schema import SECTIONS, RunConfig, TrainingSettings, section_fields, training_fields
from fsdp_tune.errors import Finding, Severity

TRUE = {"true", "t", "yes", "y", "on", "1"}
FALSE = {"false", "f", "no", "n", "off", "0"}
# Enums whose values are upper-case by convention (accelerate accepts any case; we normalise).
UPPER_ENUMS = {"fsdp.auto_wrap_policy", "fsdp.state_dict_type", "fsdp.sharding_strategy", "fsdp.backward_prefetch"}


class BadValue(ValueError):
    pass


def kind_of(path: str) -> str:
    section, name = path.split(".", 1)
    if section == "training":
        spec = training_fields().get(name)
        return spec["kind"] if spec else "any"
    f = section_fields(section)[name]
    if f.metadata.get("kind"):
        return f.metadata["kind"]
    if f.metadata.get("choices"):
        return "str"
    default = f.default if f.default is not MISSING else None
    return {bool: "bool", int: "int", float: "float", str: "str", tuple: "list"}.get(type(default), "any")


def choices_of(path: str) -> tuple[str, ...] | None:
    section, name = path.split(".", 1)
    if section == "training":
        return None
    return section_fields(section)[name].metadata.get("choices")


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
    if isinstance(value, bool):
        raise BadValue(f"must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise BadValue(f"must be a number, got {value!r}") from None


def to_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(str(v).strip() for v in value)
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    raise BadValue(f"must be a list or a comma-separated string, got {value!r}")


def to_dict(value: Any) -> dict:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    raise BadValue(f"must be a mapping (or a JSON object string), got {value!r}")


def coerce(path: str, value: Any) -> Any:
    if value is None:
        return None
    if path == "launch.mixed_precision" and value is False:
        return "no"  # YAML reads an unquoted `no` as false
    if path == "fsdp.sharding_strategy":
        value = keys.STRATEGY_BY_NUMBER.get(str(value), value)
    kind = kind_of(path)
    if kind == "bool":
        return to_bool(value)
    if kind == "int":
        return to_int(value)
    if kind == "float":
        return to_float(value)
    if kind == "list":
        return to_list(value)
    if kind == "dict":
        return to_dict(value)
    if kind == "str":
        if isinstance(value, (dict, list, bool)):
            raise BadValue(f"must be a string, got {value!r}")
        text = str(value).strip()
        choices = choices_of(path)
        if choices:
            norm = text.upper() if path in UPPER_ENUMS else text.lower()
            if norm not in choices:
                raise BadValue(f"must be one of {', '.join(choices)}; got {text!r}")
            return norm
        return text
    return value


def _reshard_value(raw: Any, version: int) -> tuple[str, Any]:
    """FSDP1 files may give reshard_after_forward as a strategy name; that means sharding_strategy."""
    if isinstance(raw, str) and raw.strip().upper() in keys.STRATEGY_TO_RESHARD:
        return "fsdp.sharding_strategy", raw.strip().upper()
    return "fsdp.reshard_after_forward", raw


def build_config(assignments: list[Assignment], config_path: str | None = None) -> tuple[RunConfig, list[Finding]]:
    findings: list[Finding] = []
    final: dict[str, Assignment] = {}
    for a in assignments:
        final[a.path] = a  # later wins: files first, flags last

    version = 2
    if "fsdp.version" in final:
        try:
            version = to_int(final["fsdp.version"].value)
        except BadValue:
            version = 2
    values: dict[str, Any] = {}
    origins = {}
    for path, a in final.items():
        target, raw = (path, a.value)
        if path == "fsdp.reshard_after_forward":
            target, raw = _reshard_value(a.value, version)
            if target == "fsdp.sharding_strategy" and version == 2:
                findings.append(
                    Finding(
                        "FT011",
                        Severity.ERROR,
                        a.origin.key,
                        a.origin.source,
                        f"FSDP2 reshard_after_forward must be true or false, got {a.value!r} (an FSDP1 strategy name)",
                        f"`{a.origin.key}: {str(keys.STRATEGY_TO_RESHARD[raw]).lower()}`, "
                        "or `fsdp-tune convert --fsdp2`",
                    )
                )
                continue
            if target == "fsdp.sharding_strategy" and "fsdp.sharding_strategy" in final:
                continue  # an explicit sharding_strategy wins (accelerate reads only that one for FSDP1)
        try:
            values[target] = coerce(target, raw)
        except BadValue as e:
            findings.append(
                Finding("FT010", Severity.ERROR, a.origin.key, a.origin.source, str(e), _value_hint(target))
            )
            continue
        origins[target] = a.origin

    if values.get("fsdp.version") is None:
        values.pop("fsdp.version", None)
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        kwargs = {p.split(".", 1)[1]: v for p, v in values.items() if p.startswith(name + ".") and v is not None}
        sections[name] = cls(**kwargs)
    training = {p.split(".", 1)[1]: v for p, v in values.items() if p.startswith("training.")}
    cfg = RunConfig(**sections, training=TrainingSettings(training), origins=origins, config_path=config_path)
    return _derive(cfg), findings


def _derive(cfg: RunConfig) -> RunConfig:
    """Settings implied by others: FSDP1's strategy decides resharding; QLoRA storage follows the dtype."""
    fsdp = cfg.fsdp
    if fsdp.sharding_strategy and not cfg.is_set("fsdp.reshard_after_forward"):
        fsdp = replace(fsdp, reshard_after_forward=keys.STRATEGY_TO_RESHARD[fsdp.sharding_strategy])
    return replace(cfg, fsdp=fsdp)


def _value_hint(path: str) -> str:
    choices = choices_of(path)
    if choices:
        return f"use one of: {', '.join(choices)}"
    kind = kind_of(path)
    return {
        "bool": "use true or false (a real boolean, not a sentence)",
        "int": "use a whole number",
        "float": "use a number",
        "list": "use a list, or a comma-separated string",
        "dict": "use a mapping",
    }.get(kind, "")
