"""What every method's data preparation shares once its sources are read: the mix (each source's share, as the
spec's sources say), the held-out rows (each source's eval split, or --test_split_size carved from the mix), the
report of data the trainer tokenizes itself (preference pairs, GRPO's prompts), and the folder that appears whole
or not at all."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from datasets import concatenate_datasets

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.runfiles import write_atomic
from fsdp_tune.sources.mixture import Source, plan_counts

REPORT = "report.json"


def mix(spec: RankSpec, trains: list, evals: list, check: Callable | None = None) -> tuple[Any, Any, list[int]]:
    """(train, eval or None, the rows each source gave): the sources mixed with the data seed; `check(train,
    eval)` before the held-out rows are carved (SFT's: something is left)."""
    seed = spec.data.seed
    counts = plan_counts([len(d) for d in trains], list(spec.data.sources))
    picked = [
        take(d, n, s, seed + k) for k, (d, n, s) in enumerate(zip(trains, counts, spec.data.sources, strict=True))
    ]
    train = concatenate_datasets(picked)
    evaluation = concatenate_datasets(evals) if evals else None
    if check is not None:
        check(train, evaluation)
    if spec.data.test_split_size:
        parts = train.train_test_split(test_size=spec.data.test_split_size, seed=seed)
        train, evaluation = parts["train"], parts["test"]
    return train, evaluation, counts


def take(dataset, count: int, source: Source, seed: int):
    """`count` rows: the first ones for TRL's fraction; a seeded random choice for weight and samples,
    repeating rows when the source has fewer (LLaMA-Factory's num_samples)."""
    n = len(dataset)
    if count == n or n == 0:
        return dataset
    if source.fraction is not None:
        return dataset.select(range(min(count, n)))
    order = np.random.default_rng(seed).permutation(n)
    indices = np.concatenate([np.tile(np.arange(n), count // n), order[: count % n]])
    return dataset.select(indices.tolist())


def columns_report(reports: list[dict], counts: list[int], train, evaluation) -> dict[str, Any]:
    """The report of data the trainer tokenizes itself (no token counts here)."""
    for report, used in zip(reports, counts, strict=True):
        report["used"] = used
    out = {"sources": reports, "sequences": len(train), "tokens": None, "loss_tokens": None, "loss_share": None}
    if evaluation is not None:
        out["eval"] = {"sequences": len(evaluation), "tokens": 0, "loss_tokens": 0}
    return out


def save_columns(train, evaluation, report: dict, out: Path) -> None:
    train.flatten_indices().save_to_disk(str(out / "train"))
    if evaluation is not None and len(evaluation):
        evaluation.flatten_indices().save_to_disk(str(out / "eval"))
    write_atomic(out / REPORT, json.dumps(report, indent=2))


def work_folder(folder: Path) -> Path:
    """A fresh folder of this process's beside `folder`, where it is built before publish moves it into place."""
    work = folder.parent / f".{folder.name}.{os.getpid()}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    return work


def publish(work: Path, folder: Path) -> None:
    """work/out becomes `folder`, whole: another machine sharing the folder that finished first made the same."""
    try:
        os.replace(work / "out", folder)
    except OSError:
        if not (folder / REPORT).exists():
            raise
    shutil.rmtree(work, ignore_errors=True)
