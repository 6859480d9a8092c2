"""A config file's text -> data, and the line of every key (for findings that say `file:line`).

YAML is a superset of JSON, so one line map serves both; a JSON file gets JSON's own error messages.
A key given twice in one mapping is refused (FT007) naming both lines: YAML and JSON keep the last one
without a word, and a second `training:` section dropped the first whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from fsdp_tune.config import limits
from fsdp_tune.errors import ConfigError, Finding, Severity, UsageError

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


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


def duplicates(path: Path, text: str) -> list[Finding]:
    """FT007 for every key given twice in one mapping, with both lines (each node walked once: aliases and
    recursive anchors cost nothing more)."""
    try:
        root = yaml.compose(text, Loader=_LOADER)
    except (yaml.YAMLError, RecursionError):
        return []
    found: list[Finding] = []
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[str, ...]]] = [(root, ())] if root is not None else []
    while stack:
        node, prefix = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack += [(v, prefix) for v in node.value]
        if not isinstance(node, yaml.MappingNode):
            continue
        lines: dict[str, int] = {}
        for k, v in node.value:
            name = str(k.value) if isinstance(k, yaml.ScalarNode) else None
            if name is not None and name != "<<" and name in lines:
                found.append(_twice(path, (*prefix, name), lines[name], k.start_mark.line + 1, v))
            elif name is not None:
                lines[name] = k.start_mark.line + 1
            stack.append((v, (*prefix, name or "?")))
    return sorted(found, key=lambda f: f.source)


def _twice(path: Path, key: tuple[str, ...], first: int, second: int, value: yaml.Node) -> Finding:
    what = "a section" if isinstance(value, yaml.MappingNode) else "a key"
    return Finding(
        "FT007",
        Severity.ERROR,
        ".".join(key),
        f"{path}:{second}",
        f"{what} given twice, at lines {first} and {second}: the file would be read with the last one only, "
        f"and line {first}{' and everything under it' if what == 'a section' else ''} dropped without a word",
        "keep one: merge the two into one",
    )


def _refuse_duplicates(path: Path, text: str) -> None:
    found = duplicates(path, text)
    if found:
        raise ConfigError(str(path), found)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: a key twice in one object is an error (found with lines by duplicates())."""
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _DuplicateKey(next(k for k in keys if keys.count(k) > 1))
    return dict(pairs)


class _DuplicateKey(ValueError):
    pass


def loads_unique(text: str) -> Any:
    """json.loads, refusing a key given twice in one object (ValueError naming it)."""
    try:
        return json.loads(text, object_pairs_hook=_pairs)
    except _DuplicateKey as dup:
        raise ValueError(f"`{dup}` is given twice in one object (JSON would keep the last without a word)") from None


def parse(path: Path, text: str) -> Any:
    if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        try:
            return limits.check_depth(str(path), json.loads(text, object_pairs_hook=_pairs))
        except _DuplicateKey as dup:
            _refuse_duplicates(path, text)
            raise UsageError(f"{path}: `{dup}` is given twice in one object", "keep one of them") from None
        except RecursionError:
            raise limits.too_deep(str(path), None) from None
        except json.JSONDecodeError as e:
            raise UsageError(
                f"{path}:{e.lineno}: not valid JSON: {e.msg}", "fix the JSON syntax at that line"
            ) from None
    limits.check_yaml(str(path), text)
    _refuse_duplicates(path, text)
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise limits.too_deep(str(path), None) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        raise UsageError(f"{where}: not valid YAML: {problem}", "fix the YAML syntax at that line") from None
