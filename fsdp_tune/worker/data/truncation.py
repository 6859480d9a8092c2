"""What the trainer cuts at max_seq_len and leaves out, counted on rank 0 after it tokenized the rows, and said:
TRL does both without a word. The method's row says how it cuts (MethodSpec.truncation), its hook which columns
its sequences are made of."""

from __future__ import annotations

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.worker.data.lengths import truncated_rows
from fsdp_tune.worker.data.preference_lengths import preference_truncation
from fsdp_tune.worker.logs import console
from fsdp_tune.worker.rank import is_main


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
