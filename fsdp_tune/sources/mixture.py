"""The datasets of a run: one `Source` per dataset (a mixture has several), in TRL's dataset-mixture terms
(trl/scripts/utils.py DatasetConfig: path, name, data_dir, data_files, split, columns, fraction) plus ours
(weight, samples, format, a columns mapping, roles), and how many rows each contributes. Pure Python.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fsdp_tune.sources.formats import AUTO, KINDS, PREFERENCE_KINDS, PROMPT_KINDS, Format

TRL_KEYS = ("path", "name", "data_dir", "data_files", "split", "columns", "fraction")
OUR_KEYS = ("weight", "samples", "format", "roles")
SHARES = ("fraction", "weight", "samples")


@dataclass(frozen=True)
class Source:
    """One dataset: where it is, which split, how to read it, and how much of it the run takes."""

    path: str  # a file, a folder, builtin:NAME, or a Hub name
    split: str = "train"  # slices allowed: train[:5%]
    eval_split: str | None = None  # the held-out split read from it, if any
    name: str | None = None  # Hub config / subset (--dataset_config)
    data_dir: str | None = None
    data_files: Any = None  # str | [str] | {split: str | [str]}
    columns: tuple[str, ...] | None = None  # TRL: keep only these columns
    column_map: dict[str, str] = field(default_factory=dict)  # logical field -> column
    roles: dict[str, str] = field(default_factory=dict)  # ShareGPT speaker -> role
    format: str = AUTO  # as asked (--dataset_format, an entry's `format:`)
    fraction: float | None = None  # TRL: share of the mixture, never repeating rows
    weight: float | None = None  # ours: share of the mixture, repeating rows of small sources if needed
    samples: int | None = None  # ours: exactly this many rows (repeated if the source has fewer)
    train_on_prompt: bool = False  # every token trained (--train_on_prompt, or PEFT's rendered-text path)
    # decided from the files read once on the launcher (decide/datafiles.py); a Hub dataset keeps the defaults
    loader: str | None = None  # json | csv | parquet | arrow | disk; None: load_dataset(path, name=...)
    files: dict[str, list[str]] = field(default_factory=dict)  # split name -> local files
    detected: Format | None = None  # the format detected on the launcher; None: rank 0 detects it

    @property
    def label(self) -> str:
        return self.path + (f" ({self.name})" if self.name else "") + f" [{self.split}]"


def entry_problems(entry: Any) -> list[str]:
    """What is wrong with one `datasets:` entry (empty when nothing is)."""
    if not isinstance(entry, Mapping):
        return [f"an entry must be a mapping with at least `path`, got {entry!r}"]
    problems = []
    unknown = sorted(set(entry) - set(TRL_KEYS) - set(OUR_KEYS))
    if unknown:
        problems.append(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(TRL_KEYS + OUR_KEYS)})")
    if not entry.get("path"):
        problems.append("no `path`")
    given = [k for k in SHARES if entry.get(k) is not None]
    if len(given) > 1:
        problems.append(f"give one of fraction, weight, samples, not {' and '.join(given)}")
    for key in given:
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            problems.append(f"{key} must be a positive number, got {value!r}")
    known = KINDS + PREFERENCE_KINDS + PROMPT_KINDS
    if entry.get("format", AUTO) not in (AUTO, *known):
        problems.append(f"format {entry['format']!r} is not one of {AUTO}, {', '.join(known)}")
    columns, roles = entry.get("columns"), entry.get("roles")
    if columns is not None and not isinstance(columns, (Mapping, list)):
        problems.append("columns must be a list (the columns to keep) or a mapping (field: column)")
    if roles is not None and not isinstance(roles, Mapping):
        problems.append("roles must be a mapping (speaker: role)")
    return problems


def mixture_problems(entries: list[Any]) -> list[str]:
    problems = [f"entry {i + 1}: {p}" for i, e in enumerate(entries) for p in entry_problems(e)]
    with_fraction = [isinstance(e, Mapping) and e.get("fraction") is not None for e in entries]
    if any(with_fraction) and not all(with_fraction):
        problems.append("`fraction` must be set on every entry or on none (TRL's rule)")
    return problems


def from_entry(entry: Mapping[str, Any], train_on_prompt: bool) -> Source:
    """A `datasets:` entry (already checked): `columns` as a list selects (TRL), as a mapping renames (ours)."""
    columns = entry.get("columns")
    return Source(
        path=str(entry["path"]),
        split=str(entry.get("split") or "train"),
        name=entry.get("name"),
        data_dir=entry.get("data_dir"),
        data_files=entry.get("data_files"),
        columns=tuple(columns) if isinstance(columns, list) else None,
        column_map=dict(columns) if isinstance(columns, Mapping) else {},
        roles=dict(entry.get("roles") or {}),
        format=entry.get("format") or AUTO,
        fraction=entry.get("fraction"),
        weight=entry.get("weight"),
        samples=None if entry.get("samples") is None else int(entry["samples"]),
        train_on_prompt=train_on_prompt,
    )


def plan_counts(sizes: list[int], sources: list[Source]) -> list[int]:
    """Rows each source contributes.

    fraction (TRL's get_dataset): shares normalised to 1 and the largest total that needs no source to repeat
    rows. samples: exactly that many, repeating rows of a smaller source (LLaMA-Factory's num_samples).
    weight: shares of the weighted sources' total size (weights re-balance, they do not grow the data),
    repeating rows of small sources as needed; once any entry has a weight, an entry with neither weight nor
    samples weighs 1 (so `weight: 2` on one entry doubles it against the others). A source with none of them,
    in a mixture without weights, is taken whole.
    """
    if any(s.fraction is not None for s in sources):
        total_fraction = sum(s.fraction or 0 for s in sources)
        shares = [(s.fraction or 0) / total_fraction for s in sources]
        total = min(n / w for n, w in zip(sizes, shares, strict=True) if w > 0)
        return [round(w * total) for w in shares]
    counts = [s.samples if s.samples is not None else n for s, n in zip(sources, sizes, strict=True)]
    if any(s.weight is not None for s in sources):
        weights = {i: s.weight or 1 for i, s in enumerate(sources) if s.samples is None}
        total_weight = sum(weights.values())
        pool = sum(sizes[i] for i in weights)
        for i, weight in weights.items():
            counts[i] = round(pool * weight / total_weight)
    return counts


_SLICE = re.compile(r"^\s*([\w.-]+)\s*(?:\[\s*(-?\d*)\s*(%?)\s*:\s*(-?\d*)\s*(%?)\s*\])?\s*$")


def split_name(spec: str) -> str:
    """'train[:5%]' -> 'train' (the launcher finds the split's files by name; `datasets` applies the slice)."""
    return spec.split("+", 1)[0].split("[", 1)[0].strip()


def slice_rows(spec: str, n: int) -> range | None:
    """The rows of a split of n rows that `name[a:b]` (absolute or %, rounded to the closest row as datasets
    does) selects; None for forms this does not read (unions with `+`)."""
    m = _SLICE.match(spec)
    if m is None:
        return None
    _, start, start_pct, stop, stop_pct = m.groups()

    def bound(value: str | None, pct: str, default: int) -> int:
        if value in (None, ""):
            return default
        number = int(value)
        number = round(n * number / 100) if pct else number
        return max(0, min(n, number + n if number < 0 else number))

    return range(bound(start, start_pct, 0), bound(stop, stop_pct, n))
