"""The training method's settings (config/methods.py): fields its TRL config lacks, DPO's and KTO's loss types and
their parameters, the reference model, and what the preference trainers do not do (packing, padding-free,
gradient checkpointing toggled around the reference forward, an adapter on lm_head). TRL checks several of these
only when the trainer is built on every rank, or at the first step (an unknown loss type), or not at all (beta)."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.methods import f_divergence_losses, fields_of, methods_taking, row_of
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


def loss_types(cfg: RunConfig) -> tuple[str, ...]:
    value = cfg.training.get("loss_type")
    return tuple(value) if isinstance(value, (list, tuple)) else (str(value),)


@rule("FT111", "method", "DPO/KTO loss types and the parameters they need")
def loss_parameters(cfg: RunConfig) -> Iterator[Finding]:
    """What DPOTrainer refuses in its constructor on every rank (exo_pair without label smoothing, an
    f-divergence or WPO weighting with loss types that cannot take them) or only warns about (robust's smoothing
    outside [0, 0.5), where its loss divides by 1 - 2 * smoothing), and loss_weights' length: for a method whose
    config has DPOConfig's loss settings (dpo_losses)."""
    if not dpo_losses(cfg):
        return
    losses, t = loss_types(cfg), cfg.training
    smoothing = float(t.get("label_smoothing") or 0)
    if "exo_pair" in losses and smoothing <= 0:
        yield error(
            cfg, "FT111", "training.loss_type", "exo_pair needs label_smoothing > 0", "--label_smoothing 1e-3 (EXO's)"
        )
    if "robust" in losses and not 0 <= smoothing < 0.5:
        message = f"robust reads label_smoothing as the chance a label flipped: it must be in [0, 0.5), got {smoothing}"
        yield error(cfg, "FT111", "training.label_smoothing", message, "--label_smoothing 0.1 (the paper's)")
    weights = t.get("loss_weights")
    if weights is not None and len(weights) != len(losses):
        message = f"{len(weights)} loss_weights for {len(losses)} loss types ({', '.join(losses)}): one weight each"
        yield error(cfg, "FT111", "training.loss_weights", message, "--loss_weights " + " ".join(["1.0"] * len(losses)))
    divergence = t.get("f_divergence_type")
    refused = [x for x in losses if x not in f_divergence_losses()]
    if divergence not in (None, "reverse_kl") and refused:
        takes = ", ".join(f_divergence_losses())
        message = f"f_divergence_type {divergence} applies to {takes}, not {', '.join(refused)}"
        yield error(cfg, "FT111", "training.f_divergence_type", message, "--f_divergence_type reverse_kl")
    sorting = [x for x in losses if x in ("aot", "aot_unpaired")]
    if t.get("use_weighting") and sorting:
        message = f"WPO weighting with {', '.join(sorting)}: those losses sort samples, misaligning per-pair weights"
        yield error(cfg, "FT111", "training.use_weighting", message, "drop --use_weighting, or use another loss_type")
    alpha = t.get("ld_alpha")
    if alpha is not None and not 0 <= alpha <= 1:
        yield warning(cfg, "FT111", "training.ld_alpha", f"LD-DPO's ld_alpha is a weight in [0, 1], got {alpha}")


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
    """KTOTrainer pairs each completion with the next one's prompt within a micro-batch to estimate the KL term
    (kto_trainer.py: rotated within chunks of per_device_train_batch_size), so it refuses a batch of 1 and any
    order but sequential (the row's kl_from_batch); apo_zero_unpaired has no KL term."""
    if not row_of(cfg.run.method).kl_from_batch or "apo_zero_unpaired" in loss_types(cfg):
        return
    t = cfg.training
    if int(t.get("per_device_train_batch_size") or 8) < 2:
        message = "kto estimates its KL term from the other examples of a micro-batch: a batch of 1 has none"
        yield error(cfg, "FT113", "training.per_device_train_batch_size", message, "--per_device_train_batch_size 2")
    if t.get("train_sampling_strategy") != "sequential":
        message = (
            f"train_sampling_strategy {t.get('train_sampling_strategy')}: kto pairs neighbouring rows for its KL "
            "term, so KTOTrainer takes sequential order only (fsdp-tune shuffles the rows once, with the seed)"
        )
        yield error(cfg, "FT113", "training.train_sampling_strategy", message, "drop --train_sampling_strategy")


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
