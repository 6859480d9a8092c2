"""`${VAR}` in a recipe: expanded from the environment, or refused; never a literal `./${RELOUT}/` folder.

Recipes are fsdp-tune's own format, shared between machines and clusters whose paths differ (`output_dir:
${SCRATCH}/runs/x`), so their string values expand `${VAR}` and `${VAR:-default}` as a shell would; `$${`
is a literal `${`. A variable that is not set and has no default is refused (FT008) with its file and line:
an empty string in its place would quietly write to `/runs/x`. The manifest records the expanded values, so
a replay runs what ran. Accelerate YAML and fsdp_config files are read as accelerate and transformers read
them, literally, where `${VAR}` is never what was meant: refused there (FT008), with the recipe as the way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from fsdp_tune.errors import Finding, Severity

_REF = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}|\$\{[^}]*\}?")


def expand(data: Any, where, env: Mapping[str, str] | None = None, literal: bool = False) -> tuple[Any, list[Finding]]:
    """`data` with every `${VAR}` in its strings expanded (or, `literal`, refused); `where(path)` names a key's
    file:line for the findings."""
    env = os.environ if env is None else env
    findings: list[Finding] = []

    def walk(value: Any, path: tuple[str, ...]) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, (*path, str(k))) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, path) for v in value]
        if isinstance(value, str) and "${" in value:
            return _one(value, path)
        return value

    def _one(text: str, path: tuple[str, ...]) -> str:
        def sub(m: re.Match) -> str:
            if m.group(0) == "$${":
                return "${"
            problem = _problem(m, env, literal)
            if problem:
                findings.append(_finding(path, where(path), m.group(0), problem, literal))
                return m.group(0)
            value = env.get(m.group(1), "")
            return value if value or m.group(2) is None else m.group(3)  # ${VAR:-default}: unset or empty

        return _REF.sub(sub, text)

    return walk(data, ()), findings


def _problem(m: re.Match, env: Mapping[str, str], literal: bool) -> str | None:
    name = m.group(1)
    if literal:
        return "this file is read as accelerate and transformers read it, literally"
    if name is None:
        return "not a variable reference: `${NAME}` or `${NAME:-default}`, NAME of letters, digits and _"
    if name not in env and m.group(2) is None:
        return f"{name} is not set in the environment, and no default is given"
    return None


def _finding(path: tuple[str, ...], source: str, ref: str, problem: str, literal: bool) -> Finding:
    hint = (
        "write the value itself, or move the setting into a recipe (recipes expand ${VAR}) or onto the command line"
        if literal
        else f"export it first, or give a default: {ref.rstrip('}')}:-VALUE}}; $${{ writes a literal ${{"
    )
    return Finding("FT008", Severity.ERROR, ".".join(path), source, f"{ref}: {problem}", hint)
