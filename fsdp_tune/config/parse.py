"""A config file's text -> data, and the line of every key (for findings that say `file:line`).

YAML is a superset of JSON, so one line map serves both; a JSON file gets JSON's own error messages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from fsdp_tune.config import limits
from fsdp_tune.errors import UsageError


def line_map(text: str) -> dict[tuple[str, ...], int]:
    """1-based line of every mapping key, by key path (YAML is a superset of JSON, so both work)."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    path = (*prefix, str(k.value))
                    lines[path] = k.start_mark.line + 1
                    walk(v, path)

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


def parse(path: Path, text: str) -> Any:
    if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        try:
            return limits.check_depth(str(path), json.loads(text))
        except RecursionError:
            raise limits.too_deep(str(path), None) from None
        except json.JSONDecodeError as e:
            raise UsageError(
                f"{path}:{e.lineno}: not valid JSON: {e.msg}", "fix the JSON syntax at that line"
            ) from None
    limits.check_yaml(str(path), text)
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise limits.too_deep(str(path), None) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        raise UsageError(f"{where}: not valid YAML: {problem}", "fix the YAML syntax at that line") from None
