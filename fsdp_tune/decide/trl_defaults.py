"""Spell TRL, get TRL's defaults: LoRA switched on with TRL's `--use_peft` gets TRL ModelConfig's defaults.

fsdp-tune's own LoRA defaults are PEFT's FSDP example's (r 64, alpha 16, dropout 0.1, every linear layer), the ones
the seed launches were written against. A user coming from `trl sft --use_peft` expects TRL's (r 16, alpha 32,
dropout 0.05, and no target modules: PEFT's default for the model type, q_proj and v_proj on Llama). When LoRA was
turned on by TRL's spelling, every LoRA setting the user did not set takes TRL's default (read from the installed
TRL's ModelConfig: config/model_config_fields.json), and one note says which.
"""

from __future__ import annotations

from dataclasses import replace

from fsdp_tune.config.lora_fields import model_config_fields, peft_default_targets
from fsdp_tune.config.schema import Origin, RunConfig
from fsdp_tune.errors import Finding, Severity

# fsdp-tune setting -> TRL ModelConfig field whose default it takes
_FIELDS = {"lora_r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout"}


def trl_spelled(cfg: RunConfig) -> bool:
    origin = cfg.origin("lora.use_peft_lora")
    return origin is not None and origin.key.lstrip("-").replace("-", "_") == "use_peft"


def apply_trl_defaults(cfg: RunConfig) -> tuple[RunConfig, list[Finding]]:
    """TRL's defaults for the LoRA settings left unset when `--use_peft` turned LoRA on; one note."""
    if not cfg.lora.use_peft_lora or not trl_spelled(cfg):
        return cfg, []
    trl = model_config_fields()
    source = f"TRL's default (--use_peft, {cfg.origin('lora.use_peft_lora').source})"
    changes, origins, said = {}, dict(cfg.origins), []
    for ours, theirs in _FIELDS.items():
        if not cfg.is_set(f"lora.{ours}"):
            value = trl[theirs]["default"]
            changes[ours] = float(value) if ours == "lora_alpha" else value
            origins[f"lora.{ours}"] = Origin(ours, source)
            said.append(f"{theirs.removeprefix('lora_')}={value}")
    if not cfg.is_set("lora.lora_target_modules") and trl["lora_target_modules"]["default"] is None:
        targets = _peft_default(cfg)
        if targets:
            changes["lora_target_modules"] = tuple(targets)
            origins["lora.lora_target_modules"] = Origin("lora_target_modules", source)
            said.append(f"target_modules={','.join(targets)} (PEFT's default for this model type)")
        else:
            said.append(
                "target_modules: fsdp-tune's default (the model's config.json is not on this machine, so "
                "PEFT's default for its type cannot be looked up)"
            )
    if not changes:
        return cfg, []
    new = replace(cfg, lora=replace(cfg.lora, **changes), origins=origins)
    note = Finding(
        "FT015",
        Severity.NOTE,
        cfg.origin("lora.use_peft_lora").key,
        cfg.origin("lora.use_peft_lora").source,
        f"LoRA by TRL's spelling: TRL's defaults {', '.join(said)}; --use_peft_lora would take PEFT's FSDP example's "
        "(r=64, alpha=16, dropout=0.1, every linear layer)",
        "",
    )
    return new, [note]


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


def _peft_default(cfg: RunConfig) -> list[str] | None:
    from fsdp_tune.sources.model import model_config

    name = cfg.model.model_name_or_path
    config = model_config(name) if name else None
    if not config:
        return None
    return peft_default_targets().get(str(config.get("model_type")))
