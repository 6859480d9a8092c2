"""SLURM's hostlist syntax (`node[01-03,07],gpu-a[1-2]-b[3,4]`) expanded into host names, in SLURM's order.

Nothing in fsdp-tune's stack expands it (torch, accelerate and the HF libraries read no SLURM variable), and
`scontrol show hostnames` is not there on a node without SLURM's client tools, so this is written by hand from
the syntax SLURM documents: comma-separated names, each with any number of bracketed ranges, a range keeping
the zero padding of its lower bound.
"""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_HOSTS = 100_000  # a list longer than any cluster is a typo ("node[1-9999999]"), refused before expanding


class HostlistError(ValueError):
    pass


def expand(text: str) -> list[str]:
    """Every host `text` names, in order; a HostlistError for what SLURM would not accept."""
    hosts: list[str] = []
    for name in _split_top(text.strip()):
        hosts += _expand_one(name)
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"more than {MAX_HOSTS} hosts")
    if not hosts:
        raise HostlistError("no host named")
    return hosts


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' at position {i}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"']' without '[' at position {i}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError("'[' without ']'")
    parts.append(text[start:])
    if any(not p for p in parts):
        raise HostlistError("an empty name between commas")
    return parts


def _expand_one(name: str) -> list[str]:
    """One name with its bracketed ranges: their product, leftmost range varying slowest (as SLURM lists them)."""
    head, bracket, rest = name.partition("[")
    if not bracket:
        if "]" in name:
            raise HostlistError(f"']' without '[' in {name!r}")
        return [name]
    ranges, _, tail = rest.partition("]")
    tails = _expand_one(tail) if tail else [""]
    return [head + n + t for n in _numbers(ranges, name) for t in tails]


def _numbers(ranges: str, name: str) -> list[str]:
    out: list[str] = []
    for part in ranges.split(","):
        m = _RANGE.match(part)
        if not m:
            raise HostlistError(f"{part!r} in {name!r} is not a number or a range a-b")
        low, high = m.group(1), m.group(2) or m.group(1)
        if int(high) < int(low):
            raise HostlistError(f"range {part!r} in {name!r} runs backwards")
        if int(high) - int(low) >= MAX_HOSTS:
            raise HostlistError(f"range {part!r} in {name!r} names more than {MAX_HOSTS} hosts")
        width = len(low) if low.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out
