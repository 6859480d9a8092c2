"""The LoraConfig every rank builds (RankSpec.lora, a LoraSpec): the `lora` section's settings, the LoraConfig
fields set by PEFT's names that reach it (config/lora_fields.py VERDICTS), and the decisions the model forces."""

from __future__ import annotations

from dataclasses import fields, replace

from fsdp_tune.config.lora_fields import VERDICTS
from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.spec import LoraSpec
from fsdp_tune.decide.vision import scoped_lora
from fsdp_tune.sources.model import ModelFacts
from fsdp_tune.sources.moe import param_targets


def lora_spec(cfg: RunConfig, model: ModelFacts) -> LoraSpec | None:
    """`model`: the model's files as the door found them (`Derived.model`). A LoraConfig field the user set by
    PEFT's name that fsdp-tune also decides (bias, task_type, exclude_modules, modules_to_save) is the user's."""
    lo = cfg.lora
    if not lo.use_peft_lora:
        return None
    targets = lo.lora_target_modules
    typed = {f.name for f in fields(LoraSpec)}
    given = {
        name: list(value) if isinstance(value, tuple) else value
        for name, value in cfg.peft.args.items()
        if VERDICTS.get(name) is not None and VERDICTS[name].action == "pass"
    }
    spec = LoraSpec(
        r=lo.lora_r,
        lora_alpha=lo.lora_alpha,
        lora_dropout=dropout(cfg, model.config),
        target_modules="all-linear" if targets == ("all-linear",) else list(targets),
        use_dora=lo.use_dora,
        # a reward model's adapter is a sequence classifier's: PEFT then also trains the new score head
        task_type="SEQ_CLS" if row_of(cfg.run.method).head == "score" else "CAUSAL_LM",
        revision=cfg.model.model_revision or None,  # recorded in adapter_config.json, as PEFT does
        peft_args={k: v for k, v in given.items() if k not in typed},
    )
    spec = replace(spec, **{k: v for k, v in given.items() if k in typed})
    return scoped_lora(cfg, model, spec)  # a vision-language model's language model, by default (decide/vision.py)


def dropout(cfg: RunConfig, config: dict | None) -> float:
    """fsdp-tune's default dropout (0.1) is 0 where a target is a parameter (MoE experts, the router,
    target_parameters): PEFT's ParamWrapper refuses any dropout. FT066 says so; a dropout the user set there is
    refused instead."""
    lo = cfg.lora
    if lo.lora_dropout and not cfg.is_set("lora.lora_dropout"):
        reach = param_targets(cfg, config)
        if reach is not None and reach.any:
            return 0.0
    return lo.lora_dropout
