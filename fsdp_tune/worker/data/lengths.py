"""Sequence lengths of a tokenized dataset, read from its Arrow list offsets: how much of the data TRL cuts at
max_seq_len (the recipe's warning), and how many tokens it kept (the data's phase line)."""

from __future__ import annotations

import numpy as np


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
