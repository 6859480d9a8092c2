"""Sequence lengths of the datasets TRL tokenized, read from their Arrow list offsets: how many tokens it kept (the
data's phase line), and what the trainer cuts at max_seq_len and leaves out, counted on rank 0 and said (TRL does both
without a word; the recipe's warning lines and the summary's truncated_sequences). The method's row says how it cuts
(MethodSpec.truncation), its hook which columns its sequences are made of.

How TRL 1.16's preference trainers meet max_length: DPO cuts each of prompt+chosen and prompt+rejected to max_length
(keeping the start) and drops a row whose prompt alone reaches it; KTO cuts prompt+completion the same way and drops
such rows too; RewardTrainer drops every pair whose chosen or rejected sequence is longer."""

from __future__ import annotations

import numpy as np

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.worker.logs import console
from fsdp_tune.worker.rank import is_main


def truncated_rows(dataset, max_len: int, packing: bool) -> tuple[int, int]:
    """(sequences cut at max_len, all sequences) in the dataset as TRL prepared it.

    TRL cuts every sequence longer than max_length, silently (without packing it truncates the row; with
    BFD packing it truncates the sequence before packing it). A sequence that is now exactly max_len long
    was cut or fitted exactly; either way the data meets the limit, so it is counted.

    Lengths come from the Arrow list offsets with numpy: no per-row Python (a million-row dataset is not
    copied into lists on every rank), and no pyarrow.compute, whose thread pool can abort the process at
    exit ("terminate called without an active exception", apache/arrow#34314).
    """
    column = "seq_lengths" if packing and "seq_lengths" in dataset.column_names else "input_ids"
    if column not in dataset.column_names:
        return 0, 0
    if column == "seq_lengths":  # packed rows: every row is kept, order does not matter; count the sequences
        chunks = dataset.data.column(column).chunks
        lengths = np.concatenate([c.flatten().to_numpy() for c in chunks] or [np.zeros(0, np.int64)])
    else:
        lengths = row_lengths(dataset, column)
    return int((lengths >= max_len).sum()), len(lengths)


def row_lengths(dataset, column: str = "input_ids"):
    """Each kept row's length in a list column, from the Arrow list offsets (numpy, as truncated_rows says
    why), in the dataset's row order: TRL's filter and shuffle leave an indices mapping of the rows it kept."""
    chunks = dataset.data.column(column).chunks
    lengths = np.concatenate([np.diff(c.offsets.to_numpy()) for c in chunks] or [np.zeros(0, np.int64)])
    indices = getattr(dataset, "_indices", None)
    return lengths[indices.column(0).to_numpy()] if indices is not None else lengths


def packed(dataset, sequences: int, strategy: str, max_len: int) -> dict | None:
    """--packing: the rows TRL packed `sequences` into (its prepared train_dataset), for the summary; None for a
    dataset without a length (streamed)."""
    try:
        rows = len(dataset)
    except TypeError:
        return None
    return {"strategy": strategy, "sequences": sequences, "rows": rows, "max_seq_len": max_len}


def preference_truncation(dataset, rows_in: int, max_len: int, sequences: tuple[tuple[str, ...], ...]) -> dict:
    """{"cut": sequences longer than max_len (TRL cuts them), "total": sequences, "dropped": rows TRL left out,
    "max_seq_len"} for the dataset TRL prepared from `rows_in` rows; `sequences`: the columns each sequence of a row
    is made of (the method's hook, worker/training/methods.py)."""
    cut = total = 0
    for parts in sequences:
        lengths = sum(row_lengths(dataset, column) for column in parts)
        cut += int((np.asarray(lengths) > max_len).sum())
        total += len(lengths)
    return {"cut": cut, "total": total, "dropped": rows_in - len(dataset), "max_seq_len": max_len}


def report_truncation(spec: RankSpec, sequences, dataset, rows_in: int | None = None) -> dict | None:
    """Say how much of the data TRL cuts at max_seq_len (and, for preference data, drops), which it does
    without a word. `sequences`: the columns the method's trainer tokenized (its hook; None: SFT's rows);
    `dataset`: the trainer's training set; `rows_in`: the training rows before the trainer tokenized them."""
    max_len = spec.data.max_seq_len
    if spec.method.truncation == "none":  # GRPO: rank 0 left out and said the prompts too long
        return None
    try:
        if sequences is not None:  # the trainer tokenized its own columns (preference data)
            found = preference_truncation(dataset, rows_in or 0, max_len, sequences)
            cut, total = found["cut"], found["total"]
        else:
            cut, total = truncated_rows(dataset, max_len, spec.data.packing)
            found = {"cut": cut, "total": total, "max_seq_len": max_len}
    except (TypeError, KeyError, AttributeError):  # an iterable (streamed) dataset: not counted
        return None
    if cut and is_main():
        console().line(
            f"warning: {cut} of {total} training sequences ({cut / total:.0%}) reach max_seq_len "
            f"{max_len} and are cut there; tokens past it are not trained on (raise --max_seq_len to keep them)"
        )
    whole = spec.method.truncation == "whole"  # RewardTrainer drops a pair with a sequence longer
    what = "chosen or rejected sequence is longer than" if whole else "prompt alone reaches"
    if rows_in and found.get("dropped") == rows_in:
        raise ValueError(
            f"no training row fits max_seq_len {max_len}: the trainer left out all {rows_in}, whose {what} it; "
            "raise --max_seq_len"
        )
    if found.get("dropped") and is_main():
        console().line(
            f"warning: the trainer left out {found['dropped']} of {rows_in} training rows whose {what} "
            f"max_seq_len {max_len} (raise --max_seq_len to keep them)"
        )
    return found
