"""Rank 0's phase lines: the recipe's named steps timed (`Phases.timed`), and those people wait on shown with
what they produced: loading model, preparing data (rows and tokens), saving. Sharding and the first step are
seen from inside Trainer.train(), by worker/training/progress.py. Every rank writes its steps' times to its log.

The recipe owns one Phases (no module state); each `show_*` line takes the step's typed result. No torch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fsdp_tune.worker.data.lengths import row_lengths
from fsdp_tune.worker.logs import console
from fsdp_tune.worker.wrappers import base


class Phases:
    """When each step of this rank started and how long it took."""

    def __init__(self, rank_started: float):
        self.started: dict[str, float] = {"rank": rank_started}  # the entry point's, before torch was imported
        self.took: dict[str, float] = {}

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        self.started[step] = t0 = time.time()
        yield
        self.took[step] = time.time() - t0
        log = console().log
        if log is not None:
            log.write(f"fsdp-tune: {step} took {self.took[step]:.2f} s\n")


def line(name: str, seconds: float | None, detail: str = "") -> None:
    took = f"{seconds:6.1f} s" if seconds is not None else " " * 8
    console().line(f"{name:<17}{took}  {detail}".rstrip())


def show_model(seconds: float, model: Any, model_spec: Any) -> None:
    """The loading line: the architecture, its parameters and their dtype (or 4-bit type)."""
    quant = model_spec.quantization
    how = f"4-bit {quant.bnb_4bit_quant_type}" if quant else model_spec.dtype
    try:
        count = f"{_millions(_base_parameters(model))} parameters in {how}"
    except (AttributeError, TypeError):
        count = how
    line("loading model", seconds, f"{_base_class(model)}, {count}")


def show_data(seconds: float, trainer: Any, rows: dict[str, int | None]) -> None:
    """Reading the data and TRL's tokenizing (in the trainer's constructor), as one phase: `rows` per split as
    read (None: streamed), the tokens TRL kept."""
    parts = []
    for name, ds in (("train", trainer.train_dataset), ("eval", trainer.eval_dataset)):
        if ds is None:
            continue
        count = rows.get(name)
        tokens = _tokens(ds)
        text = f"{count:,} {name} rows" if count is not None else f"{name} (streamed)"
        if getattr(trainer.args, "packing", False) and name == "train" and hasattr(ds, "__len__"):
            text += f" packed into {len(ds):,}"
        if tokens is not None:
            text += f", {tokens:,} tokens"
        parts.append(text)
    line("preparing data", seconds, "; ".join(parts))


def show_saved(seconds: float, adapter_check: dict | None) -> None:
    detail = f"{adapter_check['lora_tensors']} LoRA tensors, checked whole and trained" if adapter_check else ""
    line("saving", seconds, detail)


def _base_class(model: Any) -> str:
    """The architecture's name on either loading path: sharded loading hands over a PeftModel around an FSDP
    module (fully_shard renames the class FSDP<Name>)."""
    name = type(base(model)).__name__
    return name.removeprefix("FSDP") if name.startswith("FSDP") and len(name) > 4 else name


def _base_parameters(model: Any) -> int:
    """The base model's parameters, as many as the checkpoint has, on either loading path: without the adapter
    that sharded loading has applied already (its trainable parameters), and a 4-bit weight counted unpacked
    (in x out: packed, and a DTensor under sharded loading, its numel says a fraction of that)."""
    adapted = hasattr(model, "peft_config")
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen or (adapted and param.requires_grad):
                continue
            seen.add(id(param))
            four_bit = name == "weight" and type(module).__name__ == "Linear4bit"
            total += module.in_features * module.out_features if four_bit else param.numel()
    return total


def _tokens(dataset: Any) -> int | None:
    """Tokens in a tokenized dataset, from the Arrow list offsets of input_ids (rows TRL kept only)."""
    try:
        return int(row_lengths(dataset).sum())
    except (AttributeError, KeyError, TypeError, ValueError):  # an iterable (streamed) dataset: not counted
        return None


def _millions(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
