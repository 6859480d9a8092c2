"""Defaults a training method changes: DPO, KTO and GRPO recompute activations with FSDP's activation checkpointing
where TRL's own default (gradient_checkpointing=True, the Trainer's) would.

Why: DPOTrainer and KTOTrainer switch the Trainer's gradient checkpointing off and on around every reference forward
(trl/models/utils.py disable_gradient_checkpointing), GRPOTrainer around every generation (unwrap_model_for_generation),
and transformers 5.24 registers a new input-embedding hook each
time it is switched on without removing the old one (modeling_utils.py enable_input_require_grads): one more hook per
step (seen on CPU: 1 -> 7 hooks after 5 steps). FSDP's activation checkpointing wraps the decoder layers instead and
is never toggled. The user's explicit --gradient_checkpointing is refused for these methods (FT116).
"""

from __future__ import annotations

from dataclasses import replace

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import Origin, RunConfig
from fsdp_tune.errors import Finding, Severity

RULE = "FT116"
_AROUND = {False: "the reference forward", True: "the generation"}


def apply_method_defaults(cfg: RunConfig) -> tuple[RunConfig, list[Finding]]:
    """DPO/KTO/GRPO with TRL's default gradient checkpointing left as it is: FSDP's activation checkpointing instead."""
    method = cfg.run.method
    if not row_of(method).recompute_with_fsdp or cfg.training.is_set("gradient_checkpointing"):
        return cfg, []
    if cfg.fsdp.activation_checkpointing or not cfg.training.get("gradient_checkpointing"):
        return cfg, []
    origin = cfg.origin("run.method") or Origin("method", "default")
    note = Finding(
        RULE,
        Severity.NOTE,
        origin.key,
        origin.source,
        f"{method}: FSDP's activation checkpointing recomputes the layers where TRL's default gradient_checkpointing "
        f"would (the Trainer's leaks an embedding hook per step around {_AROUND[row_of(method).generates]})",
        "--gradient_checkpointing false to recompute nothing",
    )
    fsdp = replace(cfg.fsdp, activation_checkpointing=True)
    origins = {**cfg.origins, "fsdp.activation_checkpointing": Origin("activation_checkpointing", f"{method} default")}
    return replace(cfg, fsdp=fsdp, origins=origins), [note]
