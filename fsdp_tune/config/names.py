"""The names a setting goes by: every flag (and recipe `training:` key) -> canonical path, and the
TrainingArguments names transformers 5 retired. Shared by the flag parser and the file readers.
"""

from __future__ import annotations

from functools import cache

from fsdp_tune.config import keys
from fsdp_tune.config.lora_fields import OWN, TRL_MODEL_CONFIG, lora_fields
from fsdp_tune.config.methods import all_fields
from fsdp_tune.config.schema import Assignment, Origin, section_fields
from fsdp_tune.config.values import BadValue, to_bool
from fsdp_tune.errors import Finding, Severity

# Our own fields that a flag may set directly by name (launch fields too: accelerate launch flags).
_FLAG_SECTIONS = ("launch", "model", "data", "lora", "quantization", "run")
_NOT_FLAGS = {"launch.distributed_type"}


@cache
def flag_table() -> dict[str, str]:
    """flag name (underscores, no dashes) -> canonical path."""
    table: dict[str, str] = {}
    for name in sorted(all_fields()):  # every method's config fields: one it lacks is refused by FT110
        table[name] = f"training.{name}"
    for section in _FLAG_SECTIONS:
        for name in section_fields(section):
            path = f"{section}.{name}"
            if path not in _NOT_FLAGS:
                table[name] = path
    for name, path in keys.FSDP_KEYS.items():
        if path:
            table[f"fsdp_{name}"] = path
    for name in keys.PARALLELISM_KEYS:
        table[f"{keys.PARALLELISM_PREFIX}{name}"] = f"parallelism.{name}"
    table.update(peft_names())
    table.update(TRL_MODEL_CONFIG)
    table.update(keys.FLAG_ALIASES)
    return table


def peft_names() -> dict[str, str]:
    """Every LoraConfig field by PEFT's name -> its setting (config/lora_fields.py)."""
    return {name: OWN.get(name, f"peft.{name}") for name in lora_fields()}


@cache
def section_keys(section: str) -> dict[str, str]:
    """Keys a recipe section takes -> canonical path: its fields; `lora:` also every LoraConfig field by PEFT's
    name and TRL's ModelConfig LoRA names (`lora: {use_rslora: true, init_lora_weights: gaussian}`)."""
    keys_ = {name: f"{section}.{name}" for name in section_fields(section)}
    if section == "lora":
        trl_lora = {k: v for k, v in TRL_MODEL_CONFIG.items() if v.startswith(("lora.", "peft."))}
        keys_ = {**peft_names(), **trl_lora, **keys_}
    return keys_


def retired(name: str, value: object, origin: Origin) -> tuple[Assignment | None, Finding]:
    """A TrainingArguments name transformers 5 retired: read under its new name, or dropped, with a warning."""
    path, mapping, why = keys.RETIRED_ARGS[name]
    if path is None:
        return None, Finding(
            "FT012", Severity.WARNING, origin.key, origin.source, f"`{name}` is {why}; ignored", f"drop `{name}`"
        )
    if mapping is not None:
        try:
            value = mapping[to_bool(value)]
        except (BadValue, KeyError):
            pass  # left as given: the value check reports it
    new = path.split(".", 1)[1]
    shown = f"{new} {value}" if not isinstance(value, bool) else new
    return (
        Assignment(path, value, origin),
        Finding(
            "FT012",
            Severity.WARNING,
            origin.key,
            origin.source,
            f"`{name}`: {why}; read as `{shown}`",
            f"write `{new}` instead",
        ),
    )
