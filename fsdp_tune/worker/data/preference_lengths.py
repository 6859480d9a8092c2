"""How TRL 1.16's preference trainers meet max_length, read off the datasets they tokenized (Arrow list offsets,
as worker/data/lengths.py reads them): DPO cuts each of prompt+chosen and prompt+rejected to max_length (keeping
the start) and drops a row whose prompt alone reaches it; KTO cuts prompt+completion the same way and drops such
rows too; RewardTrainer drops every pair whose chosen or rejected sequence is longer. None of them says so: the
recipe does (a warning line, and the summary's truncated_sequences)."""

from __future__ import annotations

import numpy as np

from fsdp_tune.worker.data.lengths import row_lengths


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
