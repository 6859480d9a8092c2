"""The shape of a training method's rank hook (Method) and the lookup of the spec's (method_of): each method's hook
is `HOOK` in fsdp_tune/worker/methods/<name>.py, beside its row in fsdp_tune/methods/<name>.py. A hook holds the TRL
config and trainer classes, how its data is prepared, and the columns of the sequences its trainer tokenizes (for
what it cuts at max_seq_len). Everything else is the recipe's, shared by every method (worker/recipe.py): the
tokenizer, the model on its loading path, the trainer built with the same arguments and callbacks, fsdp-tune's
saving mixed into the trainer class (training/trainer.py), the adapter check and the summary.

A hook's config and trainer classes take the constructor arguments the recipe passes (model, args, train_dataset,
eval_dataset, processing_class, peft_config, callbacks) and its `prepare(spec, tokenizer) -> Prepared` makes its
data (a new kind of data: a new preparation); a trainer that takes more (a generating method's reward functions)
says so in `trainer_kwargs`, and what it needs under FSDP that TRL does not do is a class mixed in before it
(`mixin`, whose own constructor keywords come from `trainer_kwargs`: worker/training/generating.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from fsdp_tune.config.methods import ROWS, MethodRow
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.worker.data.prepare import Prepared


@dataclass(frozen=True)
class Method:
    config_class: type  # TrainingArguments subclass: the spec's trainer_args are its keyword arguments
    trainer_class: type  # the TRL trainer; fsdp-tune's saving is mixed in (training/trainer.py fsdp_trainer)
    # (spec, tokenizer, processor or None) -> the train and eval datasets, and a report
    prepare: Callable[[RankSpec, Any, Any], Prepared]
    # the tokenized columns each sequence of a row is made of, as the trainer builds them (None: SFT's rows);
    # worker/data/lengths.py counts what the trainer cuts of them
    sequences: tuple[tuple[str, ...], ...] | None = None
    # (spec, tokenizer, step) -> the trainer's further constructor arguments; step() is the global step
    trainer_kwargs: Callable[[RankSpec, Any, Callable[[], int | None]], dict[str, Any]] = lambda spec, tok, step: {}
    mixin: type | None = None  # mixed in before trainer_class (training/trainer.py fsdp_trainer)


def hooks() -> dict[str, Method]:
    """Every method's hook, by name (imports each method's TRL classes)."""
    return {name: hook_of(name) for name in ROWS}


def hook_of(name: str) -> Method:
    return import_module(f"fsdp_tune.worker.methods.{name}").HOOK


def method_of(spec: RankSpec) -> tuple[Method, MethodRow]:
    """The spec's method: its hook here and its row."""
    name = spec.method.name
    if name not in ROWS:
        raise ValueError(f"training method {name!r} is not one this fsdp-tune runs ({', '.join(ROWS)})")
    return hook_of(name), ROWS[name]
