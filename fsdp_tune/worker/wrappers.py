"""The model inside its wrappers, one helper each: what FSDP wraps (the Trainer's model_wrapped), the model
under accelerate's wrappers (a PeftModel for LoRA), the base model under PEFT's, the wrapper parts in
parameter names, and the FSDP units a model was wrapped into (for the summary, the log and the sharding
self-check). No torch at import: the phase lines (worker/phases.py) use these before and without it."""

from __future__ import annotations

from collections import Counter
from typing import Any

# Wrappers that activation checkpointing, FSDP1 and torch.compile put into parameter names.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")


def outer(trainer) -> Any:
    """The model as FSDP wraps it (the Trainer's model_wrapped once training has begun): what collectives
    gather from."""
    return trainer.model_wrapped if trainer.model_wrapped is not None else trainer.model


def inner(trainer) -> Any:
    """The model under accelerate's wrappers: a PeftModel for LoRA, the transformers model otherwise."""
    return trainer.accelerator.unwrap_model(trainer.model)


def base(model) -> Any:
    """The transformers model under PEFT's wrapper (the model itself when there is none)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def canonical_name(name: str) -> str:
    """A parameter's name without the wrapper parts (the adapter file and the checkpoint keys use these)."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def describe_units(model) -> dict[str, int]:
    """Count FSDP units by module class: the wrap plan as it was applied, for the log and the tests."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

    counts: Counter[str] = Counter()
    for module in model.modules():
        if isinstance(module, FSDPModule):
            counts[type(module).__name__.removeprefix("FSDP")] += 1
        elif isinstance(module, FSDP1):
            counts[type(module.module).__name__] += 1
    return dict(counts)
