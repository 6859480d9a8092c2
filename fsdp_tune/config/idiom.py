"""The Transformers idiom from its FSDP guide: `--fsdp "full_shard auto_wrap" --fsdp_config fsdp.json`.

`--fsdp_config` names the FSDP config (a file, or a JSON object inline): it is read like a config file,
after `--config` and before the other flags. `--fsdp` is TrainingArguments' option string; its items
become typed settings the way transformers applies them (`_apply_legacy_fsdp_to_config`: setdefault, so
an fsdp_config that says otherwise wins, with a warning here where transformers says nothing).
"""

from __future__ import annotations

from pathlib import Path

from fsdp_tune.config.parse import loads_unique
from fsdp_tune.config.readers import read_file, read_fsdp_mapping
from fsdp_tune.config.schema import Assignment
from fsdp_tune.config.values import BadValue, to_bool
from fsdp_tune.errors import Finding, Severity

STRATEGIES = {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2"}
FSDP2_RESHARD = {"full_shard": True, "shard_grad_op": False}


def apply(assignments: list[Assignment]) -> tuple[list[Assignment], list[Finding]]:
    """Replace `training.fsdp_config` and `training.fsdp` assignments by the settings they stand for."""
    findings: list[Finding] = []
    out: list[Assignment] = []
    options: list[Assignment] = []
    for a in assignments:
        if a.path == "training.fsdp_config":
            read, found = _fsdp_config(a)
            out += read
            findings += found
        elif a.path == "training.fsdp":
            options.append(a)
        else:
            out.append(a)
    for a in options:
        extra, found = _options(a, out)
        out = extra + out  # setdefault: everything already assigned wins over the option string
        findings += found
    return out, findings


def _fsdp_config(a: Assignment) -> tuple[list[Assignment], list[Finding]]:
    value = a.value
    if isinstance(value, dict):
        file = read_fsdp_mapping(value, a.origin.key)
    elif isinstance(value, str) and value.strip().startswith("{"):
        try:
            file = read_fsdp_mapping(loads_unique(value), a.origin.key)
        except (ValueError, AttributeError, RecursionError) as e:
            return [], [_bad(a, f"not a JSON object: {e}", "pass a file, or a JSON object of FSDP keys")]
    elif isinstance(value, str) and Path(value).expanduser().is_file():
        file = read_file(str(Path(value).expanduser()))
    else:
        return [], [_bad(a, f"{value!r} is neither a file nor a JSON object", "--fsdp_config path/to/fsdp.json")]
    return file.assignments, file.findings


def _options(a: Assignment, assigned: list[Assignment]) -> tuple[list[Assignment], list[Finding]]:
    if isinstance(a.value, bool) or str(a.value).strip().lower() in ("true", "false", "1", "0"):
        try:
            on = to_bool(a.value)
        except BadValue:
            on = True
        if on:
            return [], []
        return [], [_bad(a, "FSDP switched off: fsdp-tune launches FSDP runs only", "drop --fsdp false")]
    items = str(a.value).replace(",", " ").split()
    version = next((int(x.value) for x in reversed(assigned) if x.path == "fsdp.version"), 2)
    already = {x.path: x for x in assigned}
    settings: list[tuple[str, object]] = []
    findings: list[Finding] = []
    for item in (i.strip().lower() for i in items):
        if item in STRATEGIES:
            if version == 2 and item in FSDP2_RESHARD:
                settings.append(("fsdp.reshard_after_forward", FSDP2_RESHARD[item]))
            else:  # FSDP1's strategies; under FSDP2 the rules refuse the ones without an equivalent (FT023)
                settings.append(("fsdp.sharding_strategy", item.upper()))
        elif item == "offload":
            settings.append(("fsdp.cpu_offload", True))
        elif item != "auto_wrap":  # auto_wrap: the default policy already wraps the decoder layers
            findings.append(
                _bad(a, f"unknown --fsdp option `{item}`", "use full_shard, shard_grad_op, offload, auto_wrap")
            )
    extra = []
    for path, value in settings:
        if path in already:
            if str(already[path].value).lower() != str(value).lower():
                findings.append(_conflict(a, path, value, already[path]))
            continue
        extra.append(Assignment(path, value, a.origin))
    return extra, findings


def _bad(a: Assignment, message: str, hint: str) -> Finding:
    return Finding("FT013", Severity.ERROR, a.origin.key, a.origin.source, message, hint)


def _conflict(a: Assignment, path: str, value: object, existing: Assignment) -> Finding:
    def shown(v: object) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    return Finding(
        "FT013",
        Severity.WARNING,
        a.origin.key,
        a.origin.source,
        f"the option string means {path.split('.', 1)[1]}={shown(value)}, but {existing.origin} says "
        f"{shown(existing.value)}: the fsdp_config wins, as in TrainingArguments",
        "make them agree (or drop the item from --fsdp)",
    )
