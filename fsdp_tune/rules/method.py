"""The training method's settings (config/methods.py): fields its TRL config lacks, the method's own checks (DPO's
loss types and their parameters, KTO's batches: their bodies are its row's `checks`, registered here), the
reference model, and what the preference trainers do not do (packing, padding-free, gradient checkpointing toggled
around the reference forward, an adapter on lm_head). TRL checks several of these only when the trainer is built on
every rank, or at the first step (an unknown loss type), or not at all (beta)."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.methods import Settings, f_divergence_losses, fields_of, methods_taking, row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import Finding
from fsdp_tune.rules.registry import error, rule, warning

# data settings that only SFT reads (its answer masks, its text column), and what the other methods do instead
SFT_DATA = {
    "train_on_prompt": "the other methods train on completions as TRL defines them (chosen/rejected, or generated)",
    "mask_fallback": "only SFT's data has answer masks: TRL tokenizes prompt and completion apart",
    "dataset_text_field": "the data is read by its columns (prompt, chosen, rejected, completion, label)",
}


def _flag(cfg: RunConfig, path: str) -> str:
    origin = cfg.origin(path)
    return origin.key if origin else "--" + path.split(".", 1)[1]


@rule("FT110", "method", "a setting the training method's TRL config does not take")
def other_methods_fields(cfg: RunConfig) -> Iterator[Finding]:
    method = cfg.run.method
    row = row_of(method)
    fields = fields_of(method)
    for name in cfg.training.args:
        if name in fields:
            continue
        taking = [m for m in methods_taking(name) if m != method]
        where = " and ".join(f"{row_of(m).config_class} (--method {m})" for m in taking)
        yield error(
            cfg,
            "FT110",
            f"training.{name}",
            f"{name} is a field of {where}; this run's method is {method}, whose {row.config_class} has no {name}",
            f"drop {_flag(cfg, f'training.{name}')}" + (f", or --method {taking[0]}" if taking else ""),
        )
    if cfg.data.packing and not row.packs:
        yield error(
            cfg,
            "FT110",
            "data.packing",
            f"{row.config_class} does not pack: TRL 1.16's {row.trainer_class} pads each batch",
            "drop --packing",
        )
    if row.data == "sft":
        return
    for name, why in SFT_DATA.items():
        if cfg.is_set(f"data.{name}"):
            yield warning(cfg, "FT110", f"data.{name}", f"has no effect under --method {method}: {why}", "drop it")


def dpo_losses(cfg: RunConfig) -> bool:
    """The method's config has DPOConfig's loss settings (its f-divergence among them), read from the installed
    TRL's fields (training_fields.json), not from the method's name."""
    return "f_divergence_type" in fields_of(cfg.run.method)


def settings_of(cfg: RunConfig) -> Settings:
    """The training settings as plain values, for a method's own checks (methods/row.py Settings): every field of
    its TRL config and every name set, as cfg.training.get reads them."""
    t = cfg.training
    values = {name: t.get(name) for name in (*fields_of(t.method), *t.args)}
    return Settings(values, f_divergence_losses())


def loss_types(cfg: RunConfig) -> tuple[str, ...]:
    return Settings({"loss_type": cfg.training.get("loss_type")}).loss_types


# the rule ids a method's own checks find under (the row's `checks`: methods/<name>.py), each registered here so the
# catalog lists it with its family and title; the checks' bodies are the method entries'
ROW_RULES = ("FT111", "FT113")


def row_findings(cfg: RunConfig, rule_id: str) -> Iterator[Finding]:
    """The findings of the method's own checks (its row's `checks`) under `rule_id`."""
    for check in row_of(cfg.run.method).checks:
        for refused in check(settings_of(cfg)):
            if refused.rule not in ROW_RULES:
                raise RuntimeError(f"{check.__qualname__} finds under {refused.rule}, not one of {ROW_RULES}")
            if refused.rule == rule_id:
                make = error if refused.severity == "error" else warning
                yield make(cfg, refused.rule, refused.key, refused.message, refused.hint)


@rule("FT111", "method", "DPO/KTO loss types and the parameters they need")
def loss_parameters(cfg: RunConfig) -> Iterator[Finding]:
    """DPO's loss types and their parameters: the check is the method's row's (methods/dpo.py loss_parameters)."""
    yield from row_findings(cfg, "FT111")


@rule("FT112", "method", "beta must be positive")
def beta_positive(cfg: RunConfig) -> Iterator[Finding]:
    if not row_of(cfg.run.method).reference:
        return
    beta = cfg.training.get("beta")
    if beta is not None and beta <= 0:
        what = "IPO's regularization (its loss divides by beta)" if "ipo" in loss_types(cfg) else "the KL weight"
        yield error(
            cfg,
            "FT112",
            "training.beta",
            f"beta is {what} and must be above 0, got {beta}; TRL does not check it",
            "--beta 0.1 (TRL's default)",
        )


@rule("FT113", "method", "KTO's KL estimate needs batches of 2 or more, in order")
def kto_batches(cfg: RunConfig) -> Iterator[Finding]:
    """KTO's KL estimate from its micro-batch: the check is the method's row's (methods/kto.py kl_batches)."""
    yield from row_findings(cfg, "FT113")


def compares(cfg: RunConfig) -> bool:
    """The method's config has a reference model's options: DPO's and KTO's every step, GRPO's when beta > 0."""
    row = row_of(cfg.run.method)
    return row.reference or row.generates


@rule("FT114", "method", "reference model options that cannot work with LoRA under FSDP")
def reference_options(cfg: RunConfig) -> Iterator[Finding]:
    if not compares(cfg):
        return
    t = cfg.training
    if t.get("sync_ref_model"):
        yield error(
            cfg,
            "FT114",
            "training.sync_ref_model",
            "sync_ref_model mixes the policy into a separate reference model; with LoRA the reference is the "
            "frozen adapter copy (or the base) and TRL raises NotImplementedError",
            "drop --sync_ref_model",
        )
    if row_of(cfg.run.method).reference and t.get("precompute_ref_log_probs"):
        yield error(
            cfg,
            "FT114",
            "training.precompute_ref_log_probs",
            "precompute_ref_log_probs hashes the reference's weights (DTensors under FSDP2 cannot be read whole: "
            "'.numpy() is not supported for tensor subclasses') or, loaded with from_pretrained, runs before FSDP "
            "shards the model, on each rank's unsharded copy",
            "drop --precompute_ref_log_probs: the reference forward runs every step (no grad, nothing saved)",
        )


@rule("FT115", "method", "padding-free and truncation options the preference trainers drop")
def padding_options(cfg: RunConfig) -> Iterator[Finding]:
    method, t = cfg.run.method, cfg.training
    if not row_of(method).preference:
        return
    if t.get("padding_free"):
        message = "DPOTrainer turns padding_free off ('temporarily unavailable after a refactor' in TRL 1.16)"
        yield warning(cfg, "FT115", "training.padding_free", message, "drop --padding_free")
    if t.get("truncation_mode") == "keep_end":
        message = "keep_end is deprecated in TRL 1.16 (FutureWarning) and cuts the prompt's start"
        yield warning(cfg, "FT115", "training.truncation_mode", message, "drop --truncation_mode")


@rule("FT116", "method", "DPO/KTO/GRPO recompute with FSDP's activation checkpointing, not the Trainer's")
def reference_and_gradient_checkpointing(cfg: RunConfig) -> Iterator[Finding]:
    row = row_of(cfg.run.method)
    if not row.recompute_with_fsdp:
        return
    around = "generation" if row.generates else "reference forward"
    if cfg.training.is_set("gradient_checkpointing") and cfg.training.get("gradient_checkpointing"):
        yield error(
            cfg,
            "FT116",
            "training.gradient_checkpointing",
            f"{cfg.run.method}'s trainer switches gradient checkpointing off and on around every {around}, and each "
            "switch adds an input-embedding hook that is never removed (one more per step)",
            "--fsdp_activation_checkpointing true (the same recompute, never switched) instead",
        )


@rule("FT117", "method", "LoRA on lm_head under DPO/KTO/GRPO")
def lm_head_adapter(cfg: RunConfig) -> Iterator[Finding]:
    if not compares(cfg) or not cfg.lora.use_peft_lora:  # their log-probs come from lm_head.weight itself
        return
    if "lm_head" in cfg.lora.lora_target_modules:
        yield error(
            cfg,
            "FT117",
            "lora.lora_target_modules",
            "an adapter on lm_head is never trained: TRL computes the log-probabilities from lm_head.weight directly "
            "(its fused head), and refuses it",
            "drop lm_head from --lora_target_modules",
        )


@rule("FT118", "method", "full fine-tuning under a preference method or GRPO")
def preference_full_finetune(cfg: RunConfig) -> Iterator[Finding]:
    row = row_of(cfg.run.method)
    if not (row.preference or row.generates) or cfg.lora.use_peft_lora:
        return
    why = (
        "the reference would be a second, unsharded copy of the model that TRL re-loads from disk and FSDP "
        "gathers whole at every reference forward"
        if row.reference
        else "its reference (beta > 0) would be a second, unsharded copy of the model, and generating under full "
        "fine-tuning was not run here"
        if row.generates
        else "the reward head and the model would train whole; fsdp-tune runs it with LoRA only"
    )
    yield error(
        cfg,
        "FT118",
        "lora.use_peft_lora",
        f"--method {cfg.run.method} without LoRA is not run by fsdp-tune yet: {why}",
        "--use_peft_lora true (with LoRA the reference is the frozen starting adapter, or the base)",
    )
