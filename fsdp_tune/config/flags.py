"""Seed-style flags (`--lora_r 8`, `--bf16 True`, `--push_to_hub`, `--lora-r 8`) into assignments.

The flag set is data: the fields of fsdp-tune's sections, accelerate's launch flags, `--fsdp_<key>`,
`--parallelism_config_<key>`, and every SFTConfig field (read from training_fields.json, no trl import).
"""

from __future__ import annotations

from fsdp_tune.config.names import flag_table, other_name
from fsdp_tune.config.schema import Assignment, Origin
from fsdp_tune.config.suggest import did_you_mean
from fsdp_tune.config.values import kind_of
from fsdp_tune.errors import Finding, Severity


def parse_flags(argv: list[str]) -> tuple[list[Assignment], list[Finding]]:
    """Each `--name` takes the words up to the next flag: none (a bare boolean), one value, or several for a
    list-valued setting (`--lora_target_modules q_proj v_proj`, as TRL's and PEFT's argparse nargs='+')."""
    assignments: list[Assignment] = []
    findings: list[Finding] = []
    for token, words in _groups(argv):
        if token is None:
            findings += [_stray(word) for word in words]
            continue
        assignment, found = _flag(token, words)
        findings += found
        if assignment is not None:
            assignments.append(assignment)
    return assignments, findings


def _groups(argv: list[str]) -> list[tuple[str | None, list[str]]]:
    """[(flag or None for words before any flag, the words that follow it)]; `--x=v` carries its value."""
    groups: list[tuple[str | None, list[str]]] = [(None, [])]
    for token in argv:
        if token.startswith("--") and token != "--":
            name, eq, inline = token.partition("=")
            groups.append((name, [inline] if eq else []))
            if eq:
                groups.append((None, []))  # `--x=v` takes nothing more
        else:
            groups[-1][1].append(token)
    return [g for g in groups if g[0] is not None or g[1]]


def _flag(token: str, words: list[str]) -> tuple[Assignment | None, list[Finding]]:
    raw_name = token[2:]
    name = raw_name.replace("-", "_")
    origin = Origin(f"--{raw_name}", "command line")
    path = flag_table().get(name)
    read = other_name(name, words[0] if words else True, origin) if path is None else None
    if read is not None:
        assignment, finding = read
        return assignment, [finding, *(_stray(w) for w in words[1:])]
    if path is None:
        hint = did_you_mean(name, flag_table(), prefix="--") or "`fsdp-tune flags WORD` lists flags by name"
        return None, [Finding("FT001", Severity.ERROR, token, "command line", f"unknown flag `--{raw_name}`", hint)]
    kind = kind_of(path)
    if not words:
        if kind == "bool":
            return Assignment(path, True, origin), []  # `--push_to_hub` bare
        message = f"`--{raw_name}` needs a value"
        return None, [Finding("FT005", Severity.ERROR, origin.key, "command line", message, f"`--{raw_name} VALUE`")]
    if kind in ("list", "int_list", "float_list", "json", "files") and len(words) > 1:
        return Assignment(path, list(words), origin), []
    return Assignment(path, words[0], origin), [_stray(w) for w in words[1:]]


def _stray(word: str) -> Finding:
    return Finding(
        "FT005",
        Severity.ERROR,
        word,
        "command line",
        f"unexpected argument `{word}`: flags look like `--name value`",
        "quote values that contain spaces",
    )
