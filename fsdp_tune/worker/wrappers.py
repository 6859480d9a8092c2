"""The FSDP units a model was wrapped into, by module class: the wrap plan as it was applied, for the
summary, the log and the sharding self-check (worker/callbacks.py)."""

from __future__ import annotations


def describe_units(model) -> dict[str, int]:
    """Count FSDP units by module class: the wrap plan as it was applied, for the log and the tests."""
    from collections import Counter

    counts: Counter[str] = Counter()
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return {}
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

    for module in model.modules():
        if isinstance(module, FSDPModule):
            counts[type(module).__name__.removeprefix("FSDP")] += 1
        elif isinstance(module, FSDP1):
            counts[type(module.module).__name__] += 1
    return dict(counts)
