"""The training method's part of the rank spec: the arguments its TRL config takes (DPOConfig has no `packing`,
RewardConfig no `loss_type`), and GRPO's rewards, generation and reference. Pure, like rank.py.

fsdp-tune sets some SFTConfig fields for every run (max_length, packing, dataset_text_field); a method whose
config lacks one does not get it. A field the user set that the method's config lacks never gets here: FT110
refuses it first (rules/method.py).
"""

from __future__ import annotations

from typing import Any

from fsdp_tune.config.methods import GRPO, fields_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.spec import GrpoSpec


def method_args(cfg: RunConfig, args: dict[str, Any]) -> dict[str, Any]:
    """`args` (SFTConfig's as decide.trainer_args made them) kept to the fields of the method's config."""
    fields = fields_of(cfg.run.method)
    return {k: v for k, v in args.items() if k in fields}


def grpo_spec(cfg: RunConfig) -> GrpoSpec | None:
    """GRPO's rewards as resolved (the rules refused what does not resolve: FT131), how it generates and what its
    KL term compares with. The reference is the same sharded model with its adapter switched off, unless a starting
    adapter is the reference (--adapter, --reference adapter): a frozen copy of it, as DPO's."""
    if cfg.run.method != GRPO:
        return None
    from fsdp_tune.rewards.resolve import Unresolved, resolve

    rewards = []
    for entry in cfg.run.reward_funcs:
        try:
            rewards.append(resolve(entry))
        except Unresolved:
            continue
    t = cfg.training
    beta = float(t.get("beta") or 0)
    reference = (
        "off"
        if beta == 0
        else "ref_adapter"
        if cfg.model.adapter and cfg.model.reference == "adapter"
        else "adapter_disabled"
    )
    vllm = bool(t.get("use_vllm"))
    completion = int(t.get("max_completion_length") or 0)
    return GrpoSpec(
        rewards=tuple(rewards),
        generation="vllm" if vllm else "transformers",
        synced=cfg.launch.num_processes > 1,
        weight_sync="adapter" if vllm else None,
        reference=reference,
        max_prompt_tokens=cfg.data.max_seq_len - completion if completion else None,
    )
