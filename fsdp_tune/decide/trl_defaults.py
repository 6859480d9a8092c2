"""Spell TRL, get TRL's defaults: LoRA switched on with TRL's `--use_peft` gets TRL ModelConfig's defaults.

fsdp-tune's own LoRA defaults are PEFT's FSDP example's (r 64, alpha 16, dropout 0.1, every linear layer), the ones
the seed launches were written against. A user coming from `trl sft --use_peft` expects TRL's (r 16, alpha 32,
dropout 0.05, and no target modules: PEFT's default for the model type, q_proj and v_proj on Llama). When LoRA was
turned on by TRL's name, wherever it is written (`--use_peft`, `use_peft: true` in TRL's config file or in a
recipe's `lora:` or `training:`), every LoRA setting the user did not set takes TRL's default (read from the installed
TRL's ModelConfig: config/model_config_fields.json). LoRA turned on by `use_peft_lora` keeps fsdp-tune's own. Either
way one note (FT015) says which defaults the unset settings took and where they come from.
"""

from __future__ import annotations

from dataclasses import replace

from fsdp_tune.config.lora_fields import model_config_fields, peft_default_targets
from fsdp_tune.config.schema import Origin, RunConfig
from fsdp_tune.errors import Finding, Severity

# fsdp-tune setting -> TRL ModelConfig field whose default it takes
_FIELDS = {"lora_r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout"}
_TARGETS = "lora.lora_target_modules"


def trl_spelled(cfg: RunConfig) -> bool:
    """LoRA turned on by TRL's name `use_peft`: `--use_peft`, a recipe's `lora: {use_peft: true}` or
    `training: {use_peft: true}`, TRL's config file's `use_peft: true`; one answer wherever it is written."""
    origin = cfg.origin("lora.use_peft_lora")
    return origin is not None and _name(origin) == "use_peft"


def _name(origin: Origin) -> str:
    """The setting's own name as the user wrote it, without `--` or the recipe section (`lora.use_peft`)."""
    return origin.key.lstrip("-").replace("-", "_").rsplit(".", 1)[-1]


def apply_trl_defaults(cfg: RunConfig) -> tuple[RunConfig, list[Finding]]:
    """TRL's defaults for the LoRA settings left unset when `use_peft` turned LoRA on; one note (FT015) saying
    which defaults the unset settings took and where they come from, for either name of the switch."""
    if not cfg.lora.use_peft_lora or cfg.origin("lora.use_peft_lora") is None:
        return cfg, []
    unset = [name for name in (*_FIELDS, "lora_target_modules") if not cfg.is_set(f"lora.{name}")]
    if not unset:
        return cfg, []
    if not trl_spelled(cfg):
        return cfg, [_note(cfg, _peft_example_said(cfg, unset), "use_peft", "TRL's (r=16, alpha=32, dropout=0.05)")]
    new, said = _take_trl_defaults(cfg)
    return new, [_note(cfg, said, "use_peft_lora", "PEFT's FSDP example's (r=64, alpha=16, dropout=0.1)")]


def _take_trl_defaults(cfg: RunConfig) -> tuple[RunConfig, str]:
    """(cfg with TRL ModelConfig's defaults for the unset LoRA settings, what the note says of them)."""
    trl, switch = model_config_fields(), cfg.origin("lora.use_peft_lora")
    source = f"TRL's default ({switch.key}, {switch.source})"
    changes, origins, said = {}, dict(cfg.origins), []
    for ours, theirs in _FIELDS.items():
        if not cfg.is_set(f"lora.{ours}"):
            value = trl[theirs]["default"]
            changes[ours] = float(value) if ours == "lora_alpha" else value
            origins[f"lora.{ours}"] = Origin(ours, source)
            said.append(f"{theirs.removeprefix('lora_')}={value}")
    if not cfg.is_set(_TARGETS) and trl["lora_target_modules"]["default"] is None:
        targets, why_not = _peft_default(cfg)
        if targets:
            changes["lora_target_modules"] = tuple(targets)
            origins[_TARGETS] = Origin("lora_target_modules", source)
            said.append(f"target_modules={','.join(targets)} (PEFT's default for this model type)")
        else:
            said.append(f"target_modules: fsdp-tune's default ({why_not})")
    new = replace(cfg, lora=replace(cfg.lora, **changes), origins=origins) if changes else cfg
    return new, "TRL's defaults (its ModelConfig) " + ", ".join(said)


def _peft_example_said(cfg: RunConfig, unset: list[str]) -> str:
    lo = cfg.lora
    values = {"lora_r": f"r={lo.lora_r}", "lora_alpha": f"alpha={lo.lora_alpha:g}"}
    values |= {
        "lora_dropout": f"dropout={lo.lora_dropout:g}",
        "lora_target_modules": "target_modules=" + ",".join(lo.lora_target_modules),
    }
    return "PEFT's FSDP example's defaults (fsdp-tune's own) " + ", ".join(values[name] for name in unset)


def _note(cfg: RunConfig, said: str, other: str, its: str) -> Finding:
    switch = cfg.origin("lora.use_peft_lora")
    return Finding(
        "FT015",
        Severity.NOTE,
        switch.key,
        switch.source,
        f"LoRA switched on by `{_name(switch)}`: the LoRA settings left unset take {said}; `{other}` would take {its}",
        "",
    )


def defaults_note(cfg: RunConfig) -> str | None:
    """One line for `plan`: which LoRA settings are TRL's defaults."""
    taken = [
        name.removeprefix("lora_")
        for name in (*_FIELDS, "lora_target_modules")
        if (o := cfg.origin(f"lora.{name}")) is not None and o.source.startswith("TRL's default")
    ]
    if not taken:
        return None
    lo = cfg.lora
    return (
        f"LoRA r={lo.lora_r} alpha={lo.lora_alpha:g} dropout={lo.lora_dropout:g} "
        f"targets={','.join(lo.lora_target_modules)}: TRL's defaults for {', '.join(taken)} (--use_peft)"
    )


def _peft_default(cfg: RunConfig) -> tuple[list[str] | None, str]:
    """(PEFT's default targets for the model's type, or None and why there are none)."""
    from fsdp_tune.sources.model import model_config

    name = cfg.model.model_name_or_path
    config = model_config(name) if name else None
    if not config:
        return (
            None,
            "the model's config.json is not on this machine, so PEFT's default for its type cannot be looked up",
        )
    model_type = str(config.get("model_type"))
    targets = peft_default_targets().get(model_type)
    if not targets:
        return None, f"PEFT has no default target modules for model type {model_type}: TRL would stop and ask for them"
    return targets, ""
