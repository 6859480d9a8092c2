"""Seed-style flags (`--lora_r 8`, `--bf16 True`, `--push_to_hub`, `--lora-r 8`) into assignments.

The flag set is data: the fields of fsdp-tune's sections, accelerate's launch flags, `--fsdp_<key>`,
`--parallelism_config_<key>`, and every SFTConfig field (read from training_fields.json, no trl import).
"""

from __future__ import annotations

from functools import cache

from fsdp_tune.config import keys
from fsdp_tune.config.readers import Assignment
from fsdp_tune.config.schema import Origin, section_fields, training_fields
from fsdp_tune.config.suggest import did_you_mean
from fsdp_tune.errors import Finding, Severity

# Our own fields that a flag may set directly by name (launch fields too: accelerate launch flags).
_FLAG_SECTIONS = ("launch", "model", "data", "lora", "quantization", "run")
_NOT_FLAGS = {"launch.distributed_type"}


@cache
def flag_table() -> dict[str, str]:
    """flag name (underscores, no dashes) -> canonical path."""
    table: dict[str, str] = {}
    for name in training_fields():
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
    table.update(keys.FLAG_ALIASES)
    return table


def is_bool_path(path: str) -> bool:
    from fsdp_tune.config.normalize import kind_of

    return kind_of(path) == "bool"


def parse_flags(argv: list[str]) -> tuple[list[Assignment], list[Finding]]:
    table = flag_table()
    assignments: list[Assignment] = []
    findings: list[Finding] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--") or token == "--":
            findings.append(
                Finding(
                    "FT005",
                    Severity.ERROR,
                    token,
                    "command line",
                    f"unexpected argument `{token}`: flags look like `--name value`",
                    "quote values that contain spaces",
                )
            )
            continue
        raw_name, eq, inline = token[2:].partition("=")
        name = raw_name.replace("-", "_")
        path = table.get(name)
        if path is None and name in keys.RETIRED_ARGS:
            value, i = _value(argv, i, eq, inline)
            assignment, finding = retired(name, value, Origin(f"--{raw_name}", "command line"))
            findings.append(finding)
            if assignment is not None:
                assignments.append(assignment)
            continue
        if path is None:
            findings.append(
                Finding(
                    "FT001",
                    Severity.ERROR,
                    token,
                    "command line",
                    f"unknown flag `--{raw_name}`",
                    did_you_mean(name, table, prefix="--") or "run `fsdp-tune train --help`",
                )
            )
            # skip its value, if it has one, so the next flag is still read
            if not eq and i < len(argv) and not argv[i].startswith("--"):
                i += 1
            continue
        if eq:
            value: object = inline
        elif i < len(argv) and not argv[i].startswith("--"):
            value = argv[i]
            i += 1
        elif is_bool_path(path):
            value = True  # `--push_to_hub` bare
        else:
            findings.append(
                Finding(
                    "FT005",
                    Severity.ERROR,
                    f"--{raw_name}",
                    "command line",
                    f"`--{raw_name}` needs a value",
                    f"`--{raw_name} VALUE`",
                )
            )
            continue
        assignments.append(Assignment(path, value, Origin(f"--{raw_name}", "command line")))
    return assignments, findings


def _value(argv: list[str], i: int, eq: str, inline: str) -> tuple[object, int]:
    """The value of a flag at argv[i-1] (inline `--x=v`, the next word, or True when bare); the next index."""
    if eq:
        return inline, i
    if i < len(argv) and not argv[i].startswith("--"):
        return argv[i], i + 1
    return True, i


def retired(name: str, value: object, origin: Origin) -> tuple[Assignment | None, Finding]:
    """A TrainingArguments name transformers 5 retired: read under its new name, or dropped, with a warning."""
    from fsdp_tune.config.normalize import to_bool

    path, mapping, why = keys.RETIRED_ARGS[name]
    if path is None:
        return None, Finding(
            "FT012", Severity.WARNING, origin.key, origin.source, f"`{name}` is {why}; ignored", f"drop `{name}`"
        )
    if mapping is not None:
        try:
            value = mapping[to_bool(value)]
        except (ValueError, KeyError):
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
