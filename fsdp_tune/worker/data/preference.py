"""Preference data for DPO, KTO and reward models, converted once: rank 0 of each machine reads every source, turns
each row into TRL's own columns (sources/preference_rows.py: {prompt, chosen, rejected} or {prompt, completion,
label}), skips and counts the rows that cannot be trained on, mixes the sources and saves the result; every other
rank reads that result (memory-mapped), as SFT's data is prepared (worker/data/prepare.py).

TRL tokenizes these columns itself in the trainer's constructor (its DPO and KTO trainers take no pre-tokenized
rows), rank 0 first and the others from its cache. KTO's rows are shuffled once with the data seed: KTOTrainer
samples in order (its KL term pairs neighbouring rows), and pairs unpaired into two rows would otherwise sit next
to each other, or TRL's own unpairing would put a whole block of desirable rows before the undesirable ones.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.sources.formats import Format
from fsdp_tune.sources.preference import PAIRED, detect_preference
from fsdp_tune.sources.preference_rows import canonical, unpair
from fsdp_tune.worker.data.columns import Columns
from fsdp_tune.worker.data.columns import build as build_columns
from fsdp_tune.worker.data.prepare import Prepared, cache_key, load_prepared

UNPAIRED = "unpaired"  # MethodSpec.data of a method that trains on unpaired rows (KTO): pairs become two rows


def prepare_preference(spec: RankSpec, tokenizer, processor=None) -> Prepared:
    """(train, eval or None, the data report): TRL's preference columns, converted once by rank 0 of each machine."""
    key = hashlib.sha256(f"{cache_key(spec, tokenizer)}:{spec.method.data}".encode()).hexdigest()[:16]
    return load_prepared(spec, tokenizer, key, build)


def kind(data: str, seed: int) -> Columns:
    """Preference rows as `data` (MethodSpec.data) trains on them: pairs, or each pair as two unpaired rows (KTO)."""
    unpaired = data == UNPAIRED

    def read(row: dict, fmt: Format) -> tuple[list[dict], str | None]:
        converted, problem = canonical(row, fmt)
        if problem is not None:
            return [], problem.reason
        return (unpair(converted) if unpaired and fmt.kind in PAIRED else [converted]), None

    def shuffled(train, evaluation):  # KTO samples in order: desirable and undesirable rows mixed once, with the seed
        return train.shuffle(seed=seed), evaluation.shuffle(seed=seed) if evaluation is not None else None

    return Columns(
        detect=detect_preference,
        read=read,
        loss="answers",
        rows_are="rows (prompt, completion, label)" if unpaired else "pairs (prompt, chosen, rejected)",
        usable="trained on",
        mixed=shuffled if unpaired else None,
    )


def build(spec: RankSpec, tokenizer, folder: Path) -> None:
    """Convert, mix, shuffle for KTO and save; the folder appears whole or not at all."""
    build_columns(kind(spec.method.data, spec.data.seed), spec, tokenizer, folder)
