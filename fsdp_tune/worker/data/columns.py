"""Data that TRL takes as columns as they stand (preference pairs: worker/data/preference.py; GRPO's prompts:
worker/data/prompts.py), prepared on rank 0 of each machine one way: every source's format (the launcher's
detection, or rank 0's for a Hub dataset), each row read into TRL's rows or skipped and counted with its file and
line, the sources mixed, saved and said. A kind is one Columns row; what differs is in its functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.sources.formats import Format
from fsdp_tune.sources.mixture import Source
from fsdp_tune.sources.rows import LISTED, where
from fsdp_tune.worker.data.mixing import columns_report, mix, publish, save_columns, work_folder
from fsdp_tune.worker.data.prepare import check_template
from fsdp_tune.worker.data.splits import detected, load_split


@dataclass(frozen=True)
class Columns:
    """One data kind: `detect` its format (sources/: columns, rows, forced=, column_map=), `read(row, fmt)` one row
    into TRL's rows or the reason it is skipped, what the loss is on and what the rows are called (the report, the
    console), what to say when a split has none left, and what is done once the sources are mixed."""

    detect: Callable[..., Format]
    read: Callable[[dict, Format], tuple[list[dict], str | None]]
    loss: str
    rows_are: str  # "prompts", "pairs (prompt, chosen, rejected)"
    usable: str  # "used", "trained on": a split with no row left "can be ..."
    hint: Callable[[str], str] = lambda reasons: ""  # the refusal's advice, from the reasons the rows were skipped
    mixed: Callable[[Any, Any], tuple[Any, Any]] | None = None  # (train, eval) -> (train, eval), once mixed


def convert(kind: Columns, raw, fmt: Format, named: str) -> tuple[list[dict], dict[str, Any]]:
    """(TRL's rows, the split's report part): every row read, the skipped counted by reason, the first LISTED of
    each named as `named` line."""
    out: list[dict] = []
    skipped: dict[str, dict[str, Any]] = {}
    for index, row in enumerate(raw):
        rows, reason = kind.read(row, fmt)
        if reason is not None:
            seen = skipped.setdefault(reason, {"count": 0, "rows": []})
            seen["count"] += 1
            if len(seen["rows"]) < LISTED:
                seen["rows"].append(f"{named} {index + 1}")
            continue
        out += rows
    return out, {"rows": len(raw), "sequences": len(out), "skipped": skipped}


def _split(kind: Columns, raw, source: Source, split: str, fmt: Format) -> tuple[Any, dict[str, Any]]:
    rows, part = convert(kind, raw, fmt, where(source, split))
    if not rows:
        reasons = "; ".join(f"{seen['count']} row(s): {r}" for r, seen in part["skipped"].items())
        message = f"{source.label}: no row of the {split} split can be {kind.usable} ({reasons or 'no rows'})"
        raise ValueError(message + kind.hint(reasons))
    return Dataset.from_list(rows), part


def build(kind: Columns, spec: RankSpec, tokenizer, folder: Path) -> None:
    """Convert, mix and save; the folder appears whole or not at all."""
    work = work_folder(folder)
    trains, evals, reports = [], [], []
    for source in spec.data.sources:
        raw = load_split(source, source.split)
        fmt = detected(source, raw, kind.detect)
        if fmt.conversational:
            check_template(tokenizer, Format("messages", {}), source)
        train, part = _split(kind, raw, source, source.split, fmt)
        trains.append(train)
        reports.append(_report(kind, source, fmt, part))
        if source.eval_split:
            held, held_part = _split(kind, load_split(source, source.eval_split), source, source.eval_split, fmt)
            evals.append(held)
            reports[-1]["eval"] = _report(kind, source, fmt, held_part)
    train, evaluation, counts = mix(spec, trains, evals)
    if kind.mixed is not None:
        train, evaluation = kind.mixed(train, evaluation)
    report = columns_report(reports, counts, train, evaluation)
    save_columns(train, evaluation, report, work / "out")
    publish(work, folder)
    say(report, kind.rows_are)


def _report(kind: Columns, source: Source, fmt: Format, part: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": source.label,
        "format": fmt.describe(),
        "kind": fmt.kind,
        "notes": list(fmt.notes),
        "loss": kind.loss,
        "truncated": 0,
        "template_notes": {},
        **part,
    }


def say(report: dict[str, Any], rows_are: str) -> None:
    """What rank 0 says about the data before training (the summary repeats it)."""
    for s in report["sources"]:
        print(f"fsdp-tune: data: {s['source']}: {s['format']}, {s['rows']} rows -> {s['sequences']} {rows_are}")
        for reason, seen in s["skipped"].items():
            rows = ", ".join(seen["rows"])
            print(f"fsdp-tune: warning: {seen['count']} row(s) of {s['source']} skipped: {reason} ({rows})")
