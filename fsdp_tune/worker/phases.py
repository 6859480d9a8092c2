"""Rank 0's phase lines: the recipe's named steps timed (`@timed`), and those people wait on shown with what
they produced: loading model, preparing data (rows and tokens), saving. Sharding and the first step are
seen from inside Trainer.train(), by worker/progress.py. Every rank writes its steps' times to its log.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

from fsdp_tune.worker.logs import console

_started: dict[str, float] = {}
_took: dict[str, float] = {}
_rows: dict[str, int] = {}


def started(step: str) -> float | None:
    return _started.get(step)


def mark(step: str, at: float) -> None:
    """A start time seen elsewhere ("rank": the entry point's, before torch was imported)."""
    _started[step] = at


def line(name: str, seconds: float | None, detail: str = "") -> None:
    took = f"{seconds:6.1f} s" if seconds is not None else " " * 8
    console().line(f"{name:<17}{took}  {detail}".rstrip())


def timed(step: str, show: Callable[..., None] | None = None):
    """Time a recipe step; on rank 0, `show(seconds, result, *args)` then prints its line."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            _started[step] = t0 = time.time()
            result = fn(*args, **kwargs)
            _took[step] = time.time() - t0
            log = console().log
            if log is not None:
                log.write(f"fsdp-tune: {step} took {_took[step]:.2f} s\n")
            if show is not None and os.environ.get("RANK", "0") == "0":
                show(_took[step], result, *args)
            return result

        return run

    return wrap


def data_read(seconds: float, splits: Any, *_) -> None:
    """build_data: rows per split, kept for the line after tokenizing (TRL tokenizes in the trainer)."""
    if isinstance(splits, tuple):
        for name, ds in zip(("train", "eval"), splits, strict=False):  # the data step may return more
            if ds is not None and hasattr(ds, "__len__"):
                _rows[name] = len(ds)


def model_loaded(seconds: float, built: Any, spec: Any, *_) -> None:
    """build_model returns (model, the SFTConfig that trains it)."""
    model = built[0] if isinstance(built, tuple) else built
    quant = spec.model.quantization
    how = f"4-bit {quant['bnb_4bit_quant_type']}" if quant else spec.model.dtype
    try:
        count = f"{_millions(_base_parameters(model))} parameters in {how}"
    except (AttributeError, TypeError):
        count = how
    line("loading model", seconds, f"{_base_class(model)}, {count}")


def _base_class(model: Any) -> str:
    """The architecture's name on either loading path: sharded loading hands over a PeftModel around an FSDP
    module (fully_shard renames the class FSDP<Name>)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = type(base).__name__
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


def data_prepared(seconds: float, built: Any, *_) -> None:
    """build_trainer: reading the data and TRL's tokenizing (in the trainer's constructor), as one phase."""
    trainer = built[0]
    parts = []
    for name, ds in (("train", trainer.train_dataset), ("eval", trainer.eval_dataset)):
        if ds is None:
            continue
        rows = _rows.get(name)
        tokens = _tokens(ds)
        text = f"{rows:,} {name} rows" if rows is not None else f"{name} (streamed)"
        if tokens is not None:
            text += f", {tokens:,} tokens"
        parts.append(text)
    line("preparing data", seconds + _took.get("build_data", 0.0), "; ".join(parts))


def saved(seconds: float, result: Any, *_) -> None:
    check = (result or {}).get("adapter_check") if isinstance(result, dict) else None
    detail = f"{check['lora_tensors']} LoRA tensors, checked whole and trained" if check else ""
    line("saving", seconds, detail)


def _tokens(dataset: Any) -> int | None:
    """Tokens in a tokenized dataset, from the Arrow list offsets of input_ids (rows TRL kept only)."""
    from fsdp_tune.worker.data.lengths import row_lengths

    try:
        return int(row_lengths(dataset).sum())
    except (AttributeError, KeyError, TypeError, ValueError):  # an iterable (streamed) dataset: not counted
        return None


def _millions(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
