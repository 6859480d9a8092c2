"""Every row of one split, converted, checked and encoded with `Dataset.map` (in `dataset_num_proc` processes),
with the rows that cannot be trained on skipped and counted by reason. Output columns: input_ids,
assistant_masks (1 = in the loss), and the bookkeeping the report reads (skip, row, n_tokens, n_loss)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdp_tune.sources.clip import ROW_BOUND, TooLarge
from fsdp_tune.sources.convert import to_trl
from fsdp_tune.sources.encode import Encoder
from fsdp_tune.sources.formats import Format
from fsdp_tune.sources.masking import Encoded, RowRejected
from fsdp_tune.sources.mixture import Source
from fsdp_tune.sources.rowcheck import SKIPPED, check_row

# what tokenizing finds (the rest is rowcheck's, found before launch too)
TOKENIZED = {
    "template": "the chat template refuses it",
    "too-long": "the prompt fills max_seq_len: nothing left to learn",
    "too-large": f"far longer than max_seq_len and it cannot be cut (over {ROW_BOUND} x max_seq_len's worth of text)",
    "no-loss": "no answer token in the rendered text (the chat template drops the answers?)",
}
REASONS = {**SKIPPED, **TOKENIZED}
CLIPPED = "far longer than max_seq_len: only the text within its reach was rendered and tokenized"
LISTED = 5  # rows named per reason
COLUMNS = ("input_ids", "assistant_masks", "skip", "row", "n_tokens", "n_loss", "truncated", "note", "clipped")


def encode_row(row: dict, form: Format, roles: dict, encoder: Encoder, train_all: bool) -> tuple[str, list[Encoded]]:
    """(why the row is skipped, or ""; its sequences with an answer left after the cut at max_seq_len). The
    launcher's pre-flight (preflight/tokens.py) calls it too, on the rows it reads."""
    problems = [p for p in check_row(row, form, roles) if p.skips]
    if problems:
        return problems[0].code, []
    try:
        sequences = encoder.encode(to_trl(row, form, roles), train_all)
    except TooLarge:
        return "too-large", []
    except RowRejected:
        return "template", []
    kept = [s for s in sequences if any(s.mask)]
    if kept:
        return "", kept
    return ("too-long" if any(s.truncated for s in sequences) else "no-loss"), []


def encode_batch(batch: dict[str, list], indices: list[int], fmt: dict, roles: dict, encoder: Encoder, train_all: bool):
    """Rows -> sequences (a skipped row leaves one empty sequence carrying its reason; the 'split' fallback
    may give a row several sequences)."""
    form = Format.from_dict(fmt)
    out: dict[str, list] = {c: [] for c in COLUMNS}

    def emit(ids: list[int], mask: list[int], skip: str, row: int, s: Encoded | None = None) -> None:
        extra = (s.truncated, _note(s.problems), s.clipped) if s is not None else (False, "", False)
        values = (ids, mask, skip, row, len(ids), sum(mask), *extra)
        for column, value in zip(COLUMNS, values, strict=True):
            out[column].append(value)

    for k, index in enumerate(indices):
        row = {column: values[k] for column, values in batch.items()}
        skip, sequences = encode_row(row, form, roles, encoder, train_all)
        if skip:
            emit([], [], skip, index)
        for s in sequences:
            emit(s.input_ids, s.mask, "", index, s)
    return out


@dataclass
class EncodedSplit:
    kept: Any  # the sequences to train on (bookkeeping columns still there)
    every: Any  # every row, skipped ones included, for the report
    rows: int  # rows read
    where: str  # how a row is named in reports: "data/x.jsonl row"


def _note(problems: list[str]) -> str:
    """What the template did to a row, without the turn number, so that rows group by it in the report."""
    return problems[0].split(": ", 1)[-1] if problems else ""


def encode_split(raw, fmt: Format, source: Source, split: str, encoder: Encoder, train_all: bool, work: Path, num_proc):
    work.mkdir(parents=True, exist_ok=True)
    every = raw.map(
        encode_batch,
        batched=True,
        with_indices=True,
        remove_columns=raw.column_names,
        fn_kwargs={"fmt": fmt.as_dict(), "roles": dict(source.roles), "encoder": encoder, "train_all": train_all},
        num_proc=num_proc if num_proc and num_proc > 1 else None,
        cache_file_name=str(work / "encoded.arrow"),
        new_fingerprint=f"fsdp-tune-{work.name}",  # our own cache decides reuse: the tokenizer need not hash
        desc=f"fsdp-tune: {source.path} [{split}]",
    )
    kept = every.filter(
        lambda skip: [s == "" for s in skip],
        batched=True,
        input_columns=["skip"],
        cache_file_name=str(work / "kept.arrow"),
        new_fingerprint=f"fsdp-tune-{work.name}-kept",
    )
    return EncodedSplit(kept, every, len(raw), where(source, split))


def where(source: Source, split: str) -> str:
    files = [f for group in source.files.values() for f in group]
    return f"{files[0]} row" if len(files) == 1 and source.loader != "disk" else f"{source.path} [{split}] row"


def report_source(source: Source, fmt: Format, train_all: bool, encoded: EncodedSplit) -> dict[str, Any]:
    """Rows in, sequences out, and the skipped rows by reason with where the first few are."""
    reasons, rows = list(encoded.every["skip"]), list(encoded.every["row"])
    skipped: dict[str, dict[str, Any]] = {}
    for code, count in Counter(r for r in reasons if r).items():
        listed = [f"{encoded.where} {row + 1}" for reason, row in zip(reasons, rows, strict=True) if reason == code]
        skipped[REASONS.get(code, code)] = {"count": count, "rows": listed[:LISTED]}
    clipped = sorted({row for row, cut in zip(encoded.kept["row"], encoded.kept["clipped"], strict=True) if cut})
    return {
        "clipped": {"count": len(clipped), "rows": [f"{encoded.where} {r + 1}" for r in clipped[:LISTED]]},
        "source": source.label,
        "format": fmt.describe(),
        "kind": fmt.kind,
        "notes": list(fmt.notes),
        "loss": "all" if train_all or fmt.kind == "text" else "answers",
        "rows": encoded.rows,
        "sequences": len(encoded.kept),
        "truncated": int(sum(encoded.kept["truncated"])),
        "skipped": skipped,
        "template_notes": dict(Counter(n for n in encoded.kept["note"] if n).most_common(3)),
    }


def loss_counts(dataset) -> tuple[int, int]:
    """(tokens, tokens in the loss) of the rows a dataset selects (after mixing: indices into the parts)."""
    import numpy as np

    tokens = np.asarray(list(dataset["n_tokens"]), dtype=np.int64)
    in_loss = np.asarray(list(dataset["n_loss"]), dtype=np.int64)
    return int(tokens.sum()), int(in_loss.sum())
