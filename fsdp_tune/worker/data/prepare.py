"""The data, converted and tokenized once: rank 0 of each machine does it and saves the result, every other
rank reads that result (memory-mapped). The recipe runs this under `main_process_first`, so the others wait
for it; a rank that finds no result does not prepare on its own: it stops and points at rank 0's log.

Each source is loaded (splits.py), every row converted to TRL's representation, checked, and turned into
`input_ids` + `assistant_masks` (encode.py, rows.py); rows that cannot be trained on are skipped and counted
by reason, with their rows. The sources are then mixed (fraction / weight / samples), and SFTTrainer receives
the pre-tokenized dataset: TRL builds the labels from `assistant_masks` and packs as asked.

The result lives in OUTPUT_DIR/fsdp_tune_data/<key>/ (train/, eval/, report.json); the key covers the data
settings, the files, the tokenizer and the template, so a resumed run reads it again and a changed one does not.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from datasets import load_from_disk

from fsdp_tune import __version__
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.runfiles import DATA_DIR, write_atomic
from fsdp_tune.sources.encode import Encoder
from fsdp_tune.sources.formats import TEXT, Format
from fsdp_tune.sources.mixture import Source
from fsdp_tune.sources.rows import CLIPPED, IMAGE_COLUMNS, encode_split, loss_counts, report_source
from fsdp_tune.sources.vision_rows import ImageTokens, image_counts
from fsdp_tune.worker.data.mixing import REPORT, mix, publish, work_folder
from fsdp_tune.worker.data.splits import format_of, load_split
from fsdp_tune.worker.rank import local_rank


@dataclass
class Prepared:
    train: Any  # datasets.Dataset: input_ids, assistant_masks
    eval: Any  # the same, or None
    report: dict[str, Any]

    def rows(self) -> dict[str, int | None]:
        """Rows per split as read, for the data's phase line (None: streamed, not counted)."""
        return {
            name: len(ds) if hasattr(ds, "__len__") else None
            for name, ds in (("train", self.train), ("eval", self.eval))
            if ds is not None
        }


def prepare(spec: RankSpec, tokenizer, processor=None) -> Prepared:
    """(train, eval or None, the data report): pre-tokenized `input_ids` + `assistant_masks`, from which TRL
    builds the labels (only the tokens in the loss keep their id); with a vision-language model's `processor`,
    each sequence's images and their token counts too (vision_rows.py)."""
    key = cache_key(spec, tokenizer, processor)
    return load_prepared(spec, tokenizer, key, lambda s, t, folder: build(s, t, folder, processor))


def load_prepared(spec: RankSpec, tokenizer, key: str, builder) -> Prepared:
    """The datasets of folder `key` under the run's data dir, built first by rank 0 of this machine
    (`builder(spec, tokenizer, folder)`); the other ranks read what it built."""
    folder = Path(spec.output_dir) / DATA_DIR / key
    if not (folder / REPORT).exists():
        if local_rank() != 0:
            raise RuntimeError(f"rank 0 did not prepare the data in {folder}: see logs/rank-0.log")
        builder(spec, tokenizer, folder)
    report = json.loads((folder / REPORT).read_text())
    evaluation = load_from_disk(str(folder / "eval")) if (folder / "eval").exists() else None
    return Prepared(load_from_disk(str(folder / "train")), evaluation, report)


def build(spec: RankSpec, tokenizer, folder: Path, processor=None) -> None:
    """Convert, encode, mix and save; the folder appears whole or not at all (other machines may share it)."""
    work = work_folder(folder)
    images = ImageTokens(processor) if processor is not None else None
    encoder = Encoder.for_run(tokenizer, spec.data, images)
    encoder.text_only = processor is None  # a row with images is skipped ("no-vision"), not trained as text
    num_proc = spec.data.num_proc
    trains, evals, reports = [], [], []
    for i, source in enumerate(spec.data.sources):
        raw = load_split(source, source.split)
        fmt, train_all = format_of(source, raw, spec.data.text_field, spec.data.peft_text_field)
        check_template(tokenizer, fmt, source)
        encoded = encode_split(raw, fmt, source, source.split, encoder, train_all, work / f"{i}-train", num_proc)
        trains.append(encoded.kept)
        reports.append(report_source(source, fmt, train_all, encoded))
        if source.eval_split:
            raw = load_split(source, source.eval_split)
            held = encode_split(raw, fmt, source, source.eval_split, encoder, train_all, work / f"{i}-eval", num_proc)
            evals.append(held.kept)
            reports[-1]["eval"] = report_source(source, fmt, train_all, held)
    train, evaluation, counts = mix(spec, trains, evals, lambda t, e: something_left(t, e, reports))
    report = summarise(reports, counts, train, evaluation)
    _save(train, evaluation, report, work)
    publish(work, folder)
    print_report(report)


class NothingLeft(ValueError):
    """Every training (or held-out) row was skipped: said with the reasons and the rows, where the Trainer would
    fail on an empty dataset (an IndexError) or on a missing eval_dataset."""


def something_left(train, evaluation, reports: list[dict]) -> None:
    if not len(train):
        raise NothingLeft(f"no training row is left: {_skips(reports)}")
    if evaluation is not None and not len(evaluation):
        held = [r["eval"] for r in reports if "eval" in r]
        raise NothingLeft(f"no held-out row is left for --eval_strategy: {_skips(held)}")


def _skips(reports: list[dict]) -> str:
    said = [
        f"{r['source']}: {seen['count']} row(s) skipped, {reason} ({', '.join(seen['rows'][:3])})"
        for r in reports
        for reason, seen in r["skipped"].items()
    ]
    return "; ".join(said) or "the data has no rows"


def _save(train, evaluation, report: dict, work: Path) -> None:
    """The training columns; a vision-language run's images beside them when any sequence has one (data without
    images trains as text: no rank runs the vision tower, on every rank alike)."""
    out = work / "out"
    columns = ["input_ids", "assistant_masks"] + (list(IMAGE_COLUMNS) if report.get("images") else [])
    train.select_columns(columns).flatten_indices().save_to_disk(str(out / "train"))
    if evaluation is not None and len(evaluation):
        evaluation.select_columns(columns).flatten_indices().save_to_disk(str(out / "eval"))
    write_atomic(out / REPORT, json.dumps(report, indent=2))


def check_template(tokenizer, fmt: Format, source: Source) -> None:
    chat = fmt.kind != TEXT and (fmt.kind != "prompt_completion" or fmt.conversational)
    if chat and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{source.label} is chat data ({fmt.describe()}) and the tokenizer has no chat template: "
            "pass --chat_template_format chatml (or zephyr), or use a model that ships one"
        )


def summarise(reports: list[dict], counts: list[int], train, evaluation) -> dict[str, Any]:
    tokens, in_loss = loss_counts(train)
    for report, used in zip(reports, counts, strict=True):
        report["used"] = used
    out = {"sources": reports, "sequences": len(train), "tokens": tokens, "loss_tokens": in_loss}
    out.update(image_counts(train, evaluation))
    out["loss_share"] = round(in_loss / tokens, 4) if tokens else None
    if evaluation is not None:
        eval_tokens, eval_loss = loss_counts(evaluation)
        out["eval"] = {"sequences": len(evaluation), "tokens": eval_tokens, "loss_tokens": eval_loss}
    return out


def print_report(report: dict[str, Any]) -> None:
    """What rank 0 says about the data before training (the summary repeats it)."""
    for s in report["sources"]:
        loss = "every token" if s["loss"] == "all" else "the answers"
        print(
            f"fsdp-tune: data: {s['source']}: {s['format']}, {s['rows']} rows -> {s['sequences']} sequences, "
            f"loss on {loss}"
        )
        for reason, seen in s["skipped"].items():
            rows = ", ".join(seen["rows"]) + (f"; the first: {seen['first']}" if seen.get("first") else "")
            print(f"fsdp-tune: warning: {seen['count']} row(s) of {s['source']} skipped: {reason} ({rows})")
        clipped = s.get("clipped") or {}
        if clipped.get("count"):
            rows = ", ".join(clipped["rows"])
            print(f"fsdp-tune: note: {clipped['count']} row(s) of {s['source']} {CLIPPED} ({rows})")
        for note, count in s["template_notes"].items():
            print(f"fsdp-tune: note: {count} sequence(s) of {s['source']}: {note}")
    if report["loss_share"] is not None:
        print(f"fsdp-tune: data: {report['loss_share']:.1%} of {report['tokens']} training tokens are in the loss")
    seen = (report.get("images") or {}).get("train")
    if seen:
        print(
            f"fsdp-tune: data: {seen['image_sequences']} of {report['sequences']} training sequences have images "
            f"({seen['images']} images, {seen['image_tokens']} image tokens once expanded)"
        )


def cache_key(spec: RankSpec, tokenizer, processor=None) -> str:
    """Everything the prepared data depends on: the data settings, the files (size, time), the tokenizer and
    its template, how TRL cuts sequences, the seed (in the data settings), and this code's version."""
    files = [f for s in spec.data.sources for group in s.files.values() for f in group]
    stats = [(f, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files if os.path.exists(f)]
    data = asdict(spec.data)  # how TRL cuts and packs included (DataSpec's truncation_mode, packing_strategy, ...)
    key = {
        "data": data,
        "files": stats,
        "tokenizer": [tokenizer.name_or_path, tokenizer.chat_template, len(tokenizer), tokenizer.eos_token],
        "images": processor.image_processor.to_dict() if processor is not None else None,
        "version": __version__,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
