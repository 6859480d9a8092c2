"""Bounds on a config file, checked before it is parsed into objects (FT006).

A launch config is a few kilobytes. Without bounds, a 668-byte YAML of nested aliases ("billion laughs")
expands to a billion nodes when anything walks it (41 s and 5.6 GB before a MemoryError), a 200 MB file is
read and parsed for minutes, and deep nesting overflows the recursive parsers (a RecursionError, reported
as an internal error). Here the file's size is checked from its metadata, and YAML's event stream (an
iterative parser) is counted as if every alias were expanded, stopping at the first bound passed: a hostile
file is refused in milliseconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fsdp_tune.errors import ConfigError, Finding, Severity

MAX_BYTES = 1 << 20  # 1 MiB
MAX_NODES = 100_000  # values and collections, with every alias expanded
MAX_DEPTH = 64  # collections inside collections

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def refuse(path: str, line: int | None, message: str, hint: str) -> ConfigError:
    source = f"{path}:{line}" if line else path
    return ConfigError(path, [Finding("FT006", Severity.ERROR, "(file)", source, message, hint)])


def check_size(path: Path) -> None:
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise refuse(
            str(path),
            None,
            f"{size / 2**20:.1f} MiB: larger than any launch config ({MAX_BYTES // 2**20} MiB at most)",
            "pass the launch config (an Accelerate YAML, an fsdp_config JSON or a recipe), not a data file",
        )


def check_yaml(path: str, text: str) -> None:
    """Count YAML's events with aliases expanded; a syntax error is left to the parser's own message."""
    total = 0
    anchors: dict[str, int] = {}
    open_at: list[tuple[int, str | None]] = []  # for each open collection: the count when it opened, its anchor
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, yaml.AliasEvent):
                total += anchors.get(event.anchor, 1)
            elif isinstance(event, yaml.ScalarEvent):
                total += 1
                if event.anchor:
                    anchors[event.anchor] = 1
            elif isinstance(event, yaml.CollectionStartEvent):
                open_at.append((total, event.anchor))
                total += 1
                if len(open_at) > MAX_DEPTH:
                    raise too_deep(path, event.start_mark.line + 1)
            elif isinstance(event, yaml.CollectionEndEvent):
                began, anchor = open_at.pop()
                if anchor:
                    anchors[anchor] = total - began
            if total > MAX_NODES:
                raise refuse(
                    path,
                    event.start_mark.line + 1,
                    f"more than {MAX_NODES:,} values once its aliases (*name) are expanded: a launch config has a "
                    "few dozen",
                    "write the values out, or use fewer nested aliases",
                )
    except yaml.YAMLError as err:
        if "nesting depth" in str(err):  # libyaml's own bound (1000), met before our count got there
            raise too_deep(path, getattr(getattr(err, "problem_mark", None), "line", -1) + 1 or None) from None


def check_depth(path: str, data: Any) -> Any:
    """`data` (parsed JSON) when nested within bounds; walked without recursion."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise too_deep(path, None)
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return data


def too_deep(path: str, line: int | None) -> ConfigError:
    return refuse(
        path,
        line,
        f"nested more than {MAX_DEPTH} levels deep: a launch config has three or four",
        "pass the launch config itself (an Accelerate YAML, an fsdp_config JSON or a recipe)",
    )
