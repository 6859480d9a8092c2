"""Decisions derived from the typed config that both the plan and the ranks need (pure, no torch)."""

from __future__ import annotations

from typing import Any

from fsdp_tune.config.schema import RunConfig


def fsdp_config(cfg: RunConfig, on_cpu: bool = False) -> dict[str, Any]:
    """Transformers' `fsdp_config` dict, in the spelling TrainingArguments reads."""
    f = cfg.fsdp
    out: dict[str, Any] = {
        "version": f.version,
        # on CPU the parameters already live in host memory; FSDP2's offload policy would try to pin them
        # for a GPU and fail ("Cannot access accelerator device when none is available")
        "cpu_offload": f.cpu_offload and not on_cpu,
        "auto_wrap_policy": f.auto_wrap_policy,
        "state_dict_type": f.state_dict_type,
        "cpu_ram_efficient_loading": f.cpu_ram_efficient_loading,
        "activation_checkpointing": f.activation_checkpointing,
    }
    if f.version == 1:
        out["reshard_after_forward"] = f.sharding_strategy or (
            "FULL_SHARD" if f.reshard_after_forward else "SHARD_GRAD_OP"
        )
        for key in ("backward_prefetch", "forward_prefetch", "use_orig_params", "sync_module_states"):
            if getattr(f, key) is not None:
                out[key] = getattr(f, key)
    else:
        out["reshard_after_forward"] = f.reshard_after_forward
    if f.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" and f.transformer_layer_cls_to_wrap:
        out["transformer_layer_cls_to_wrap"] = list(f.transformer_layer_cls_to_wrap)
    if f.auto_wrap_policy == "SIZE_BASED_WRAP":
        out["min_num_params"] = f.min_num_params
    return out


def gradient_checkpointing(cfg: RunConfig) -> bool:
    """TRL defaults gradient_checkpointing=True, which Trainer refuses next to FSDP's own activation
    checkpointing: the user's explicit choice stands (a rule rejects the clash), TRL's default yields."""
    if cfg.fsdp.activation_checkpointing:
        return False
    return bool(cfg.training.get("gradient_checkpointing"))
