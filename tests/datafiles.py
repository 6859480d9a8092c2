"""Data files the tests write: JSON-lines files, and a Hub dataset as `datasets` caches it (read offline).
Shared by the one-process data tests (tests/lib/test_data_prepare.py) and the runs (tests/dist/test_data_train.py)."""

from __future__ import annotations

import json
from pathlib import Path


def jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def hub_cache(root: Path, repo: str, config: str, files: dict[str, Path]) -> None:
    """A Hub dataset as `datasets` leaves it in its cache after one online load (what offline runs read)."""
    import datasets

    builder = datasets.load_dataset_builder(
        "json", data_files={k: str(v) for k, v in files.items()}, cache_dir=str(root / "build")
    )
    builder.download_and_prepare()
    namespace, name = repo.split("/")
    dest = root / f"{namespace}___{name}" / config / "0.0.0" / "0123abcd"
    dest.parent.mkdir(parents=True)
    Path(builder.cache_dir).rename(dest)
    for f in dest.glob("json-*.arrow"):
        f.rename(dest / f.name.replace("json-", f"{name}-"))
    info = json.loads((dest / "dataset_info.json").read_text())
    (dest / "dataset_info.json").write_text(json.dumps({**info, "config_name": config}))
