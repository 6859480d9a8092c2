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
