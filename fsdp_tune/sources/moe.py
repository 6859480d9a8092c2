"""Which weights LoRA reaches through PEFT's parameter targeting, read from the config (no torch, no peft).

transformers 5 fuses a mixture-of-experts layer's experts into 3-D parameters (Mixtral's
`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]) and its router into a module holding a bare
parameter; neither is an nn.Linear. PEFT 0.21 maps the pre-fusion target names (Mixtral's w1/w2/w3/gate,
Qwen-MoE's gate_proj/up_proj/down_proj/gate) onto those parameters (`target_parameters`, its table in
config/lora_fields.json): `all-linear` reaches the experts *and the router*; a list reaches what it names.
Each such target is a `lora.ParamWrapper`, which refuses dropout, DoRA, lora_bias and fan_in_fan_out.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsdp_tune.config.lora_fields import moe_tables
from fsdp_tune.config.schema import RunConfig

EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
ROUTER = "gate.weight"


def has_experts(section: dict) -> bool:
    """A config (or its text_config) gives a layer more than one expert."""
    return any(isinstance(section.get(k), int) and section[k] > 1 for k in EXPERT_COUNT_KEYS)


@dataclass(frozen=True)
class ParamTargets:
    """What the run's LoRA targets reach beyond nn.Linear modules."""

    moe: bool  # the model has experts (its config says how many)
    family: str | None  # PEFT's conversion family (mixtral, qwen2_moe), None when PEFT does not convert it
    experts: tuple[str, ...]  # fused expert parameters adapted (gate_up_proj, down_proj)
    router: bool  # the router's weight adapted
    explicit: tuple[str, ...]  # target_parameters the user named
    half_fused: tuple[str, ...]  # names of a fused pair given without the other (PEFT refuses)

    @property
    def any(self) -> bool:
        """Some target is a ParamWrapper (no dropout, DoRA, lora_bias)."""
        return bool(self.experts or self.router or self.explicit)


def param_targets(cfg: RunConfig, config: dict | None) -> ParamTargets | None:
    """None when LoRA is off or the model's config (`config`: its config.json as the door found it, `Derived.model`)
    is not on this machine."""
    if not cfg.lora.use_peft_lora:
        return None
    explicit = tuple(cfg.peft.get("target_parameters") or ())
    if config is None:
        return ParamTargets(False, None, (), False, explicit, ()) if explicit else None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    moe = has_experts(text)
    tables = moe_tables()
    family = tables["model_types"].get(str(config.get("model_type")))
    if family is None:
        return ParamTargets(moe, None, (), False, explicit, ())
    mapping = tables["targets"][family]
    targets = cfg.lora.lora_target_modules
    if targets == ("all-linear",):
        matched = set(mapping)
    else:
        matched = {old for old in mapping if any(t == old or t.endswith(f".{old}") for t in targets)}
    reached = {mapping[old] for old in matched}
    half = tuple(
        sorted(n for olds in tables["fused"][family].values() if 0 < len(matched & set(olds)) < len(olds) for n in olds)
    )
    experts = tuple(sorted(p for p in reached if p != ROUTER))
    return ParamTargets(moe, family, experts, ROUTER in reached, explicit, half)
