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
from typing import Any

from datasets import Dataset

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.sources.formats import Format
from fsdp_tune.sources.mixture import Source
from fsdp_tune.sources.preference import PAIRED, detect_preference
from fsdp_tune.sources.preference_rows import canonical, unpair
from fsdp_tune.sources.rows import LISTED, where
from fsdp_tune.worker.data.mixing import columns_report, mix, publish, save_columns, work_folder
from fsdp_tune.worker.data.prepare import Prepared, cache_key, check_template, load_prepared
from fsdp_tune.worker.data.splits import detected, load_split

UNPAIRED = "unpaired"  # MethodSpec.data of a method that trains on unpaired rows (KTO): pairs become two rows


def prepare_preference(spec: RankSpec, tokenizer, processor=None) -> Prepared:
    """(train, eval or None, the data report): TRL's preference columns, converted once by rank 0 of each machine."""
    key = hashlib.sha256(f"{cache_key(spec, tokenizer)}:{spec.method.data}".encode()).hexdigest()[:16]
    return load_prepared(spec, tokenizer, key, build)


def convert(raw, fmt: Format, data: str, named: str) -> tuple[list[dict], dict[str, Any]]:
    """(TRL's rows, the split's report part): every row converted, pairs unpaired for `data` "unpaired" (KTO),
    problems counted."""
    out: list[dict] = []
    skipped: dict[str, dict[str, Any]] = {}
    for index, row in enumerate(raw):
        converted, problem = canonical(row, fmt)
        if problem is not None:
            seen = skipped.setdefault(problem.reason, {"count": 0, "rows": []})
            seen["count"] += 1
            if len(seen["rows"]) < LISTED:
                seen["rows"].append(f"{named} {index + 1}")
            continue
        out += unpair(converted) if data == UNPAIRED and fmt.kind in PAIRED else [converted]
    return out, {"rows": len(raw), "sequences": len(out), "skipped": skipped}


def _split(raw, source: Source, split: str, fmt: Format, data: str) -> tuple[Any, dict[str, Any]]:
    rows, part = convert(raw, fmt, data, where(source, split))
    if not rows:
        reasons = "; ".join(f"{seen['count']} row(s): {r}" for r, seen in part["skipped"].items())
        raise ValueError(f"{source.label}: no row of the {split} split can be trained on ({reasons or 'no rows'})")
    return Dataset.from_list(rows), part


def build(spec: RankSpec, tokenizer, folder: Path) -> None:
    """Convert, mix, shuffle for KTO and save; the folder appears whole or not at all."""
    work = work_folder(folder)
    trains, evals, reports = [], [], []
    for source in spec.data.sources:
        raw = load_split(source, source.split)
        fmt = detected(source, raw, detect_preference)
        if fmt.conversational:
            check_template(tokenizer, Format("messages", {}), source)
        train, part = _split(raw, source, source.split, fmt, spec.method.data)
        trains.append(train)
        reports.append(_report(source, fmt, part))
        if source.eval_split:
            held, held_part = _split(
                load_split(source, source.eval_split), source, source.eval_split, fmt, spec.method.data
            )
            evals.append(held)
            reports[-1]["eval"] = _report(source, fmt, held_part)
    train, evaluation, counts = mix(spec, trains, evals)
    if spec.method.data == UNPAIRED:  # KTO samples in order: mix desirable and undesirable rows once, with the seed
        seed = spec.data.seed
        train = train.shuffle(seed=seed)
        evaluation = evaluation.shuffle(seed=seed) if evaluation is not None else None
    report = columns_report(reports, counts, train, evaluation)
    save_columns(train, evaluation, report, work / "out")
    publish(work, folder)
    print_report(report, spec.method.data)


def _report(source: Source, fmt: Format, part: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": source.label,
        "format": fmt.describe(),
        "kind": fmt.kind,
        "notes": list(fmt.notes),
        "loss": "answers",
        "truncated": 0,
        "template_notes": {},
        **part,
    }


def print_report(report: dict[str, Any], data: str) -> None:
    """What rank 0 says about the data before training (the summary repeats it)."""
    what = "rows (prompt, completion, label)" if data == UNPAIRED else "pairs (prompt, chosen, rejected)"
    for s in report["sources"]:
        print(f"fsdp-tune: data: {s['source']}: {s['format']}, {s['rows']} rows -> {s['sequences']} {what}")
        for reason, seen in s["skipped"].items():
            rows = ", ".join(seen["rows"])
            print(f"fsdp-tune: warning: {seen['count']} row(s) of {s['source']} skipped: {reason} ({rows})")
