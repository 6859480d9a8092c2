"""PEFT-aware FSDP wrapping that actually shards.

Trainer replaces the plugin's auto-wrap policy with PEFT's `fsdp_auto_wrap_policy` for every PEFT model
(transformers `update_fsdp_plugin_peft`). That lambda/_or_policy is what FSDP1 needs (frozen and
trainable parameters must not share a FlatParameter when use_orig_params=False), but accelerate's FSDP2
path recognises only the transformer and size policies: handed PEFT's, it wraps nothing but the root,
so every rank gathers the whole model at once and sharding saves no memory. FSDP2 shards per parameter,
so mixed requires_grad inside a decoder layer is fine: for FSDP2 we keep the decoder-layer policy and
let the rest of the update (QLoRA's mixed precision = storage dtype) happen as before.
"""

from __future__ import annotations

import functools


def install() -> None:
    import transformers.trainer as trainer_module

    original = trainer_module.update_fsdp_plugin_peft
    if getattr(original, "_fsdp_tune_wrap", False):
        return

    @functools.wraps(original)
    def update_fsdp_plugin_peft(model, accelerator):
        plugin = accelerator.state.fsdp_plugin
        policy = plugin.auto_wrap_policy
        original(model, accelerator)
        if plugin.fsdp_version == 2:
            plugin.auto_wrap_policy = policy

    update_fsdp_plugin_peft._fsdp_tune_wrap = True  # type: ignore[attr-defined]
    trainer_module.update_fsdp_plugin_peft = update_fsdp_plugin_peft


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
