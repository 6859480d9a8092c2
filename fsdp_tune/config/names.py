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
    if section == "training":  # the Trainer's checkpointing under transformers 5's name: the same setting
        keys_ = {**keys_, **keys.TRAINER_CHECKPOINTING}
    if section == "lora":
        trl_lora = {k: v for k, v in TRL_MODEL_CONFIG.items() if v.startswith(("lora.", "peft."))}
        keys_ = {**peft_names(), **trl_lora, **keys_}
    return keys_


@cache
def trl_file_names() -> frozenset[str]:
    """The names that mark TRL's flat `--config` YAML (`trl sft --config sft.yaml`): the script's arguments
    (ScriptArguments, ModelConfig, the method's config, DatasetMixtureConfig) at the top level. Names an Accelerate
    YAML or a Transformers fsdp_config also uses (`debug`, `use_cpu`, `fsdp_config`, FSDP keys) mark nothing."""
    shared = {*keys.ACCELERATE_TOP, "fsdp", "fsdp_config"}
    names = {
        name
        for name, path in flag_table().items()
        if not path.startswith(("launch.", "fsdp.", "parallelism."))
        and name.removeprefix("fsdp_") not in keys.FSDP_KEYS
    }
    return frozenset((names | set(keys.RETIRED_ARGS) | set(keys.TRL_SCRIPT_ONLY)) - shared)


def other_name(name: str, value: object, origin: Origin) -> tuple[Assignment | None, Finding] | None:
    """A name that is not a setting but is still read, with a warning: a TrainingArguments name transformers 5
    retired (FT012), or one only TRL's scripts read (FT017); None for any other name."""
    if name in keys.RETIRED_ARGS:
        return retired(name, value, origin)
    if name in keys.TRL_SCRIPT_ONLY:
        why = keys.TRL_SCRIPT_ONLY[name]
        message = f"`{name}` is {why}; ignored"
        return None, Finding("FT017", Severity.WARNING, origin.key, origin.source, message, f"drop `{name}`")
    return None


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
