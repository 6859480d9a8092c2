"""One setting, two spellings, two values: an error that names both (FT014).

Several names set one thing (`--use_peft` and `--use_peft_lora`, `--dtype` and `--torch_dtype`,
`--load_in_4bit` and `--use_4bit_quantization`, `--lora_modules_to_save` and `--modules_to_save`). Across
places the later place wins as always (a flag over the file); within one place (the command line, or one
file) there is no order a user means, so when the values disagree neither is picked.
"""

from __future__ import annotations

from fsdp_tune.config.schema import Assignment
from fsdp_tune.config.values import BadValue, coerce
from fsdp_tune.errors import Finding, Severity


def _place(a: Assignment) -> str:
    source = a.origin.source
    return source if source == "command line" else source.rsplit(":", 1)[0]


def _spelling(a: Assignment) -> str:
    return a.origin.key.lstrip("-").replace("-", "_")


def disagreements(assignments: list[Assignment]) -> list[Finding]:
    seen: dict[tuple[str, str], list[Assignment]] = {}
    for a in assignments:
        seen.setdefault((a.path, _place(a)), []).append(a)
    findings = []
    for group in seen.values():
        spellings = {_spelling(a) for a in group}
        if len(spellings) < 2:
            continue
        try:
            values = {repr(coerce(a.path, a.value)) for a in group}
        except BadValue:
            continue  # the value itself is reported where it is coerced
        if len(values) > 1:
            first, last = group[0], group[-1]
            findings.append(
                Finding(
                    "FT014",
                    Severity.ERROR,
                    last.origin.key,
                    last.origin.source,
                    f"`{first.origin.key} {first.value}` ({first.origin.source}) and `{last.origin.key} {last.value}` "
                    f"set the same setting ({last.path.split('.', 1)[1]}) to different values",
                    f"keep one of {first.origin.key} and {last.origin.key}",
                )
            )
    return findings
