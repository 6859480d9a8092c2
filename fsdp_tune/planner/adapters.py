"""LoRA's trainable values where PEFT reaches parameters rather than nn.Linear modules (MoE experts and routers,
target_parameters): counted exactly, by PEFT itself, on the meta device (no weights).

PEFT 0.21 maps the targets onto transformers 5's fused experts (`all-linear` on Mixtral adds the experts'
gate_up_proj and down_proj and the router's weight) and doubles the rank of a fused pair (gate_up_proj: 2r,
its rank_pattern); a ParamWrapper on an [E, out, in] parameter holds lora_A [r x E, in] and lora_B
[out, r x E]. Rather than copy those rules, the planner builds the model on the meta device, applies the
LoraConfig every rank will build (decide/lora.py) and counts. Dense models keep weights.py's per-Linear
arithmetic.
"""

from __future__ import annotations

import json
from functools import cache

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.lora import lora_spec
from fsdp_tune.planner.shape import ModelShape
from fsdp_tune.planner.stack import Stack
from fsdp_tune.sources.moe import param_targets


def counted_by_peft(cfg: RunConfig, shape: ModelShape) -> bool:
    """The run's targets reach parameters (the arithmetic over nn.Linear would miss them)."""
    reach = param_targets(cfg, shape.facts.config)
    return reach is not None and reach.any


def peft_trainable(cfg: RunConfig, shape: ModelShape) -> int:
    """PEFT's own count of the LoraConfig the ranks build, on the model the shape was measured from."""
    lora = lora_spec(cfg, shape.facts)
    kwargs = lora.kwargs() if lora is not None else {}
    kwargs["init_lora_weights"] = False  # shapes only: no initialisation runs on the meta device
    # what PEFT's ParamWrapper refuses (FT066 refuses the run) is left out, so such a config is still planned
    kwargs.update(lora_dropout=0.0, use_dora=False, lora_bias=False, fan_in_fan_out=False)
    return _count(json.dumps(shape.facts.config, sort_keys=True), json.dumps(kwargs, sort_keys=True))


@cache
def _count(config_json: str, kwargs_json: str) -> int:
    import warnings

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(config_json)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**data))
    with warnings.catch_warnings():  # PEFT's notes on the patterns it writes for fused experts
        warnings.simplefilter("ignore")
        model = get_peft_model(model, LoraConfig(**json.loads(kwargs_json)))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def expert_copy_bytes(cfg: RunConfig, shape: ModelShape, st: Stack) -> float:
    """One MoE layer's adapted experts, rebuilt with their LoRA. PEFT's LoRA on a fused expert parameter is a
    parametrization: every forward computes W + scaling * B @ A (one baddbmm) as a new tensor the size of the
    layer's whole gathered expert stack, and the grouped matmul saves it for backward, beside FSDP's gathered
    weights (measured on CPU: tests/dist/test_architectures.py). Held from a layer's forward to its backward:
    every MoE layer's without checkpointing, the recomputed layer's with it."""
    reach = param_targets(cfg, shape.facts.config)
    if reach is None or not reach.experts:
        return 0.0
    return float(sum(n for leaf, n in shape.expert_tensors if leaf in reach.experts) * st.compute_bytes)
