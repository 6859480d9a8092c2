"""Every row of one split, converted, checked and encoded with `Dataset.map` (in `dataset_num_proc` processes),
with the rows that cannot be trained on skipped and counted by reason. Output columns: input_ids,
assistant_masks (1 = in the loss), and the bookkeeping the report reads (skip, row, n_tokens, n_loss)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdp_tune.sources import vision_rows
from fsdp_tune.sources.clip import ROW_BOUND, TooLarge
from fsdp_tune.sources.convert import to_trl
from fsdp_tune.sources.encode import Encoder
from fsdp_tune.sources.formats import Format
from fsdp_tune.sources.masking import Encoded, RowRejected
from fsdp_tune.sources.mixture import Source
from fsdp_tune.sources.rowcheck import SKIPPED, check_row
from fsdp_tune.sources.vision import image_root

# what tokenizing finds (the rest is rowcheck's, found before launch too)
TOKENIZED = {
    "template": "the chat template refuses it",
    "too-long": "the prompt fills max_seq_len: nothing left to learn",
    "too-large": f"far longer than max_seq_len and it cannot be cut (over {ROW_BOUND} x max_seq_len's worth of text)",
    "no-loss": "no answer token in the rendered text (the chat template drops the answers?)",
    **vision_rows.SKIPS,
}
REASONS = {**SKIPPED, **TOKENIZED}
CLIPPED = "far longer than max_seq_len: only the text within its reach was rendered and tokenized"
LISTED = 5  # rows named per reason
COLUMNS = ("input_ids", "assistant_masks", "skip", "row", "n_tokens", "n_loss", "truncated", "note", "clipped")
IMAGE_COLUMNS = ("images", "image_tokens")  # a vision-language run's (vision_rows.py)


def encode_row(
    row: dict, form: Format, roles: dict, encoder: Encoder, train_all: bool, root: Path | None = None
) -> tuple[str, list[Encoded]]:
    """(why the row is skipped, or ""; its sequences with an answer left after the cut at max_seq_len; a row with
    images in a vision-language run: each carrying its images and their token counts, sources/vision_rows.py, `root`
    the folder of its relative image paths). The launcher's pre-flight (preflight/tokens.py) calls it too, on the
    rows it reads (there without images: their tokens are counted on rank 0)."""
    code, _, sequences = explained_row(row, form, roles, encoder, train_all, root)
    return code, sequences


def explained_row(
    row: dict, form: Format, roles: dict, encoder: Encoder, train_all: bool, root: Path | None = None
) -> tuple[str, str, list[Encoded]]:
    """encode_row's (code, what exactly, sequences): the detail ("turn 3: role 'narrator'", the template's own
    error) goes into the report beside the reason, so a skipped row says why in the summary."""
    problems = [p for p in check_row(row, form, roles) if p.skips]
    if problems:
        return problems[0].code, problems[0].detail, []
    converted = to_trl(row, form, roles)
    if converted.get("images") and encoder.text_only:
        return "no-vision", "", []
    try:
        if converted.get("images") and encoder.images is not None:
            why, sequences = vision_rows.sequences(encoder, converted, train_all, root or Path.cwd())
            if why:
                return why, "", []
        else:
            sequences = encoder.encode(converted, train_all)
    except TooLarge:
        return "too-large", "", []
    except RowRejected as e:
        return "template", " ".join(str(e).split())[:300], []
    kept = [s for s in sequences if any(s.mask)]
    if kept:
        return "", "", kept
    return ("too-long" if any(s.truncated for s in sequences) else "no-loss"), "", []


def encode_batch(
    batch: dict[str, list],
    indices: list[int],
    fmt: dict,
    roles: dict,
    encoder: Encoder,
    train_all: bool,
    root: str | None = None,
):
    """Rows -> sequences (a skipped row leaves one empty sequence carrying its reason; the 'split' fallback
    may give a row several sequences). A vision-language run's sequences also carry their images and each one's
    token count (IMAGE_COLUMNS, empty for a text-only row)."""
    form = Format.from_dict(fmt)
    columns = COLUMNS + (IMAGE_COLUMNS if encoder.images is not None else ())
    out: dict[str, list] = {c: [] for c in columns}

    def emit(ids: list[int], mask: list[int], skip: str, row: int, s: Encoded | None = None, why: str = "") -> None:
        extra = (s.truncated, _note(s.problems), s.clipped) if s is not None else (False, why, False)
        media = (s.images, s.image_tokens) if s is not None else ([], [])
        values = (ids, mask, skip, row, len(ids), sum(mask), *extra, *media)
        for column, value in zip(columns, values, strict=False):  # the image columns only where they are
            out[column].append(value)

    for k, index in enumerate(indices):
        row = {column: values[k] for column, values in batch.items()}
        skip, why, sequences = explained_row(row, form, roles, encoder, train_all, Path(root) if root else None)
        if skip:
            emit([], [], skip, index, why=why)  # a skipped row's note: what exactly (report_source)
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
    root = str(image_root(source.path, [f for group in source.files.values() for f in group]))
    kwargs = {"fmt": fmt.as_dict(), "roles": dict(source.roles), "encoder": encoder, "train_all": train_all}
    every = raw.map(
        encode_batch,
        batched=True,
        with_indices=True,
        remove_columns=raw.column_names,
        features=features() if encoder.images is not None else None,  # empty image lists have no type of their own
        fn_kwargs={**kwargs, "root": root},
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


def features():
    """The columns of a vision-language run's encoded rows, typed (datasets cannot infer a type from a batch whose
    rows hold no image)."""
    from datasets import Features, List, Value

    ints, text, flag = List(Value("int64")), Value("string"), Value("bool")
    image = {k: Value(v) for k, v in vision_rows.IMAGE_FEATURE.items()}
    return Features(
        input_ids=ints,
        assistant_masks=ints,
        skip=text,
        row=Value("int64"),
        n_tokens=Value("int64"),
        n_loss=Value("int64"),
        truncated=flag,
        note=text,
        clipped=flag,
        images=List(image),
        image_tokens=ints,
    )


def where(source: Source, split: str) -> str:
    files = [f for group in source.files.values() for f in group]
    return f"{files[0]} row" if len(files) == 1 and source.loader != "disk" else f"{source.path} [{split}] row"


def report_source(source: Source, fmt: Format, train_all: bool, encoded: EncodedSplit) -> dict[str, Any]:
    """Rows in, sequences out, and the skipped rows by reason with where the first few are."""
    reasons, rows, notes = list(encoded.every["skip"]), list(encoded.every["row"]), list(encoded.every["note"])
    skipped: dict[str, dict[str, Any]] = {}
    for code, count in Counter(r for r in reasons if r).items():
        listed = [f"{encoded.where} {row + 1}" for reason, row in zip(reasons, rows, strict=True) if reason == code]
        first = next((n for reason, n in zip(reasons, notes, strict=True) if reason == code and n), "")
        skipped[REASONS.get(code, code)] = {
            "count": count,
            "rows": listed[:LISTED],
            **({"first": first} if first else {}),
        }
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
