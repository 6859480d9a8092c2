"""The flags `train`, `validate-config` and `plan` take: the common ones by group for `--help`, and all of them
(`fsdp-tune flags [GROUP|WORD]`), read off the same tables the flag parser uses (config/names.py), so the
list cannot drift from what is accepted."""

from __future__ import annotations

from dataclasses import MISSING
from typing import Any

# The flags a first run needs, by group (tests/unit/test_cli_help.py checks each is a flag).
COMMON: dict[str, tuple[str, ...]] = {
    "model": ("model_name_or_path", "dtype", "attn_implementation", "trust_remote_code", "loading"),
    "data": ("dataset_name", "dataset_format", "dataset_columns", "max_seq_len", "packing", "train_on_prompt"),
    "lora": ("use_peft_lora", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "use_dora"),
    "quantization": ("use_4bit_quantization", "bnb_4bit_compute_dtype", "use_nested_quant"),
    "training": (
        "output_dir",
        "num_train_epochs",
        "max_steps",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "learning_rate",
        "lr_scheduler_type",
        "warmup_steps",
        "optim",
        "bf16",
        "gradient_checkpointing",
        "logging_steps",
        "save_strategy",
        "save_steps",
        "eval_strategy",
        "report_to",
        "resume_from_checkpoint",
        "seed",
    ),
    "fsdp": ("fsdp_version", "fsdp_reshard_after_forward", "fsdp_cpu_offload", "fsdp_activation_checkpointing"),
    "launch": ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port", "use_cpu"),
    "run": ("overwrite_output_dir", "save_on_interrupt"),
}
GROUPS = ("model", "data", "lora", "quantization", "training", "fsdp", "parallelism", "launch", "run")
_SECTION_GROUP = {"peft": "lora", "parallelism": "parallelism"}


def help_epilog() -> str:
    """The common flags by group, for `train --help` (a constant: --help stays as fast as it is)."""
    lines = ["\b", "Common flags (any SFTConfig field, LoraConfig field, --fsdp_<key> ... too):"]
    for group, names in COMMON.items():
        row = f"  {group + ':':<14}"
        for flag in (f"--{n}" for n in names):
            if len(row) + len(flag) > 100:
                lines.append(row.rstrip())
                row = " " * 16
            row += flag + " "
        lines.append(row.rstrip())
    lines += [
        "\b",
        "All flags, with their kinds, defaults and allowed values: fsdp-tune flags [GROUP|WORD]",
        f"  groups: {', '.join(GROUPS)}",
    ]
    return "\n".join(lines)


def group_of(path: str) -> str:
    section = path.split(".", 1)[0]
    return _SECTION_GROUP.get(section, section)


def describe(name: str, path: str) -> dict[str, Any]:
    """One flag: its group, what it sets, its kind, default and allowed values."""
    from fsdp_tune.config.values import choices_of, kind_of

    return {
        "flag": f"--{name}",
        "group": group_of(path),
        "sets": path,
        "kind": kind_of(path),
        "default": _default(path),
        "choices": list(choices_of(path) or ()),
    }


def _default(path: str) -> Any:
    from fsdp_tune.config.lora_fields import lora_fields
    from fsdp_tune.config.schema import section_fields, training_fields

    section, name = path.split(".", 1)
    if section == "training":  # SFTConfig's default, else that of the first method whose config has the field
        from fsdp_tune.config.methods import methods_taking

        taking = methods_taking(name)
        return (training_fields(taking[0] if taking else "sft").get(name) or {}).get("default")
    if section == "peft":
        return (lora_fields().get(name) or {}).get("default")
    f = section_fields(section)[name]
    return None if f.default is MISSING else f.default


def select(word: str | None) -> list[dict[str, Any]]:
    """Every flag of a group (`lora`), or every flag whose name contains `word`, by group then name; `word` another
    tool's name for a setting (config/suggest.py OTHER_NAMES) lists our flag too, saying whose name it was."""
    from fsdp_tune.config.names import flag_table
    from fsdp_tune.config.suggest import OTHER_NAMES

    flags = [describe(n, p) for n, p in flag_table().items()]
    if word:
        key = word.lower().lstrip("-").replace("-", "_")
        other = OTHER_NAMES.get(key)  # another tool's name (axolotl's micro_batch_size): our flag, said whose it was
        if other is not None:
            flags = [
                {**f, "other_name": f"{key} is {other[1]} name"} if f["flag"] == f"--{other[0]}" else f for f in flags
            ]
        flags = [f for f in flags if f["group"] == key] or [f for f in flags if key in f["flag"] or "other_name" in f]
    return sorted(flags, key=lambda f: (GROUPS.index(f["group"]) if f["group"] in GROUPS else 99, f["flag"]))


def format_flags(flags: list[dict[str, Any]], full_choices: bool) -> str:
    """Grouped lines: `--flag  kind  default  (sets path)`, and the allowed values when a field has them."""
    lines, group = [], None
    width = max((len(f["flag"]) for f in flags), default=0)
    for f in flags:
        if f["group"] != group:
            group = f["group"]
            lines.append(f"{group}:")
        sets = "" if f["sets"].endswith("." + f["flag"][2:]) else f"  (sets {f['sets']})"
        known = f"  ({f['other_name']})" if "other_name" in f else ""
        row = f"  {f['flag']:<{width}}  {f['kind']:<11} default {_shown(f['default'])}{sets}{known}"
        lines.append(row)
        if f["choices"]:
            shown = f["choices"] if full_choices or len(f["choices"]) <= 8 else [*f["choices"][:8], "..."]
            lines.append(f"  {'':<{width}}  one of: {', '.join(shown)}")
    return "\n".join(lines)


def _shown(value: Any) -> str:
    if value in (None, "", [], (), {}):
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."
