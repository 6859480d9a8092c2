"""Where a dataset's rows are on this machine, found without `datasets`: a builtin, a file, a folder of split
files or of shards, a `save_to_disk` folder, files named by `data_files` / `data_dir`; anything else is a Hub
name (read from the local cache when offline).

The launcher locates every source once; the rank spec carries what it found (Source.loader and .files), so
the ranks load exactly these files.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from fsdp_tune.sources.mixture import Source, split_name

BUILTIN = {"builtin:demo-chat": "demo_chat"}
EXTENSIONS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".tsv": "csv", ".arrow": "arrow"}
LOADERS = ("json", "csv", "parquet", "arrow")  # `path: json` with data_files, as datasets and TRL allow
DISK = "disk"  # a folder written by Dataset(Dict).save_to_disk: load_from_disk
SPLIT_ALIASES = {
    "train": ("train", "training"),
    "test": ("test", "testing", "eval"),
    "validation": ("validation", "valid", "val", "dev"),
}


@dataclass(frozen=True)
class Located:
    """A source's local files by split name (empty for a Hub dataset), and why it cannot be read, if so."""

    loader: str | None
    files: dict[str, list[str]] = field(default_factory=dict)
    problem: str | None = None  # the message of a PF010/PF019 finding
    hint: str = ""

    @property
    def is_local(self) -> bool:
        return self.loader is not None


def looks_local(name: str) -> bool:
    return name in BUILTIN or name.startswith((".", "/", "~")) or Path(name).suffix.lower() in EXTENSIONS


def locate(source: Source) -> Located:
    """The files of `source` on this machine, or `Located(None)` for a Hub dataset."""
    name = source.path
    if name in BUILTIN:
        base = Path(str(resources.files("fsdp_tune.assets").joinpath(BUILTIN[name])))
        return Located("json", {p.stem: [str(p)] for p in sorted(base.glob("*.jsonl"))})
    path = Path(name).expanduser()
    if source.data_files is not None and (name in LOADERS or path.is_dir()):
        return _data_files(source, None if name in LOADERS else path)
    if path.is_file():
        loader = EXTENSIONS.get(path.suffix.lower())
        if loader is None:
            return Located(
                DISK, problem=f"{name}: a {path.suffix or 'file without extension'} file is no dataset format"
            )
        return Located(loader, {split_name(source.split): [str(path)]})
    if path.is_dir():
        return _folder(path / source.data_dir if source.data_dir else path, name)
    if looks_local(name):
        return Located("json", problem=f"{name} does not exist", hint="check the path")
    return Located(None)


def _data_files(source: Source, base: Path | None) -> Located:
    """data_files as `datasets` reads them: a path or a list (the train split), or {split: path(s)}; globs."""
    given = source.data_files if isinstance(source.data_files, dict) else {"train": source.data_files}
    found: dict[str, list[str]] = {}
    for split, patterns in given.items():
        for pattern in [patterns] if isinstance(patterns, str) else list(patterns):
            full = str(base / pattern) if base is not None else os.path.expanduser(pattern)
            matches = sorted(glob.glob(full, recursive=True)) or [full]
            found.setdefault(split, []).extend(matches)
    missing = [f for files in found.values() for f in files if not Path(f).is_file()]
    if missing:
        return Located("json", problem=f"data_files {', '.join(missing[:3])} not found", hint="check data_files")
    return _one_loader(found, f"data_files of {source.path}")


def _folder(path: Path, name: str) -> Located:
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        return Located(DISK, {s: [str(path / s)] for s in splits})
    if (path / "state.json").is_file() and (path / "dataset_info.json").is_file():
        return Located(DISK, {"train": [str(path)]})
    files = sorted(
        str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() in EXTENSIONS and not _hidden(p, path)
    )
    if not files:
        known = ", ".join(EXTENSIONS)
        return Located("json", problem=f"{name}: no data files in the folder", hint=f"put files ending {known} there")
    return _one_loader(_by_split(path, files), name)


def _hidden(p: Path, root: Path) -> bool:
    return any(part.startswith((".", "_")) for part in p.relative_to(root).parts)


def _by_split(root: Path, files: list[str]) -> dict[str, list[str]]:
    """Split names from file or folder names (train.jsonl, test-00000-of-00001.parquet, validation/x.csv), as
    datasets infers them; a folder of files none of which names a split is one train split."""
    found: dict[str, list[str]] = {}
    for f in files:
        parts = Path(f).relative_to(root).parts
        words = [p.lower() for p in parts[:-1]] + [Path(parts[-1]).stem.lower().replace("_", "-").split("-")[0]]
        split = next((s for s, aliases in SPLIT_ALIASES.items() for w in words if w in aliases), None)
        found.setdefault(split or "", []).append(f)
    if "" in found and len(found) > 1:
        found.setdefault("train", []).extend(found.pop(""))
    return {k or "train": v for k, v in found.items()}


def _one_loader(files: dict[str, list[str]], what: str) -> Located:
    """One loader for every file of a source: `datasets` reads a folder with one builder."""
    kinds: dict[str, list[str]] = {}
    for f in (f for group in files.values() for f in group):
        kinds.setdefault(EXTENSIONS.get(Path(f).suffix.lower(), Path(f).suffix or "?"), []).append(f)
    if len(kinds) > 1:
        listed = "; ".join(f"{k}: {', '.join(Path(f).name for f in v[:3])}" for k, v in kinds.items())
        return Located(
            next(iter(kinds)),
            files,
            problem=f"{what} mixes file types ({listed}); datasets reads a folder with one reader",
            hint="keep one type per folder, or list each type as its own `datasets:` entry",
        )
    return Located(next(iter(kinds)), files)


def dataset_cached(name: str) -> bool:
    """A Hub dataset that `datasets` can load offline: in the Hub cache or in datasets' own cache."""
    from fsdp_tune.sources.model import hf_home, hub_cached

    if hub_cached(name, "datasets"):
        return True
    cache = Path(os.environ.get("HF_DATASETS_CACHE") or hf_home().expanduser() / "datasets").expanduser()
    namespace, _, dataset = name.rpartition("/")
    snake = re.sub(r"([a-z\d])([A-Z])", r"\1_\2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", dataset)).lower()
    return (cache / "___".join(p for p in (namespace, snake) if p)).is_dir()  # datasets' camelcase_to_snakecase
