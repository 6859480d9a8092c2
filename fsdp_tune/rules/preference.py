"""Preference methods, continued: the reward model's head, a starting adapter's reference, and settings a method
accepts but ignores (each dropped with a warning that says so, never silently)."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import Derived
from fsdp_tune.errors import Finding
from fsdp_tune.rules.method import compares, dpo_losses, loss_types
from fsdp_tune.rules.registry import error, rule, warning

# DPO's loss types that read label_smoothing (dpo_trainer.py _compute_loss)
SMOOTHED = ("exo_pair", "robust", "aot", "aot_unpaired")


@rule("FT119", "method", "the reward model's head: one score, a sequence classifier's adapter")
def reward_head(cfg: RunConfig) -> Iterator[Finding]:
    if row_of(cfg.run.method).head != "score":
        return
    init = cfg.training.get("model_init_kwargs")
    labels = init.get("num_labels") if isinstance(init, dict) else None
    if labels is not None and labels != 1:
        yield error(
            cfg,
            "FT119",
            "training.model_init_kwargs",
            f"num_labels {labels}: a reward model scores each sequence with one number (RewardTrainer refuses "
            "num_labels != 1)",
            "drop num_labels from --model_init_kwargs",
        )
    task = cfg.peft.args.get("task_type")
    if task is not None and str(task).upper() != "SEQ_CLS":
        yield error(
            cfg,
            "FT119",
            "peft.task_type",
            f"task_type {task}: a reward model's adapter is a sequence classifier's (SEQ_CLS), which also trains "
            "the new score head (PEFT puts it in modules_to_save)",
            "drop --lora_task_type",
        )


@rule("FT120", "method", "settings the training method accepts and ignores (dropped, with a warning)")
def ignored_settings(cfg: RunConfig) -> Iterator[Finding]:
    method, t = cfg.run.method, cfg.training
    row = row_of(method)
    unused = []
    if compares(cfg):
        if not t.get("sync_ref_model"):
            synced = ("ref_model_mixup_alpha", "ref_model_sync_steps")
            unused += [(n, "only read with --sync_ref_model") for n in synced]
        if row.reference and not t.get("precompute_ref_log_probs"):
            unused.append(("precompute_ref_batch_size", "only read with --precompute_ref_log_probs"))
    if dpo_losses(cfg):
        losses = loss_types(cfg)
        if not any(x in SMOOTHED for x in losses):
            unused.append(("label_smoothing", f"only {', '.join(SMOOTHED)} read it, not {', '.join(losses)}"))
        if "discopop" not in losses:
            unused.append(("discopop_tau", "only the discopop loss reads it"))
        if t.get("f_divergence_type") != "alpha_divergence":
            unused.append(("f_alpha_divergence_coef", "only read with --f_divergence_type alpha_divergence"))
    if row.preference or row.generates:
        why = "fsdp-tune passes no compute_metrics: evaluation reports the loss and the method's own metrics"
        unused += [(n, why) for n in ("batch_eval_metrics", "include_for_metrics")]
    for name, why in unused:
        if t.is_set(name):
            yield warning(cfg, "FT120", f"training.{name}", f"has no effect here: {why}", "drop it")
    if cfg.is_set("model.reference") and not cfg.model.adapter:
        why = "without --adapter the reference is the base model (the new adapter starts at zero)"
        yield warning(cfg, "FT120", "model.reference", f"has no effect: {why}", "drop it, or add --adapter RUN_DIR")
    elif cfg.is_set("model.reference") and row.generates and not float(t.get("beta") or 0):
        why = f"with beta 0 {row.says} has no KL term, so no reference"
        yield warning(cfg, "FT120", "model.reference", f"has no effect: {why}", "drop it, or set --beta 0.04")
    elif cfg.is_set("model.reference") and not compares(cfg):
        why = f"--method {method} has no reference model"
        yield warning(cfg, "FT120", "model.reference", f"has no effect: {why}", "drop it")


@rule("FT122", "method", "--reference base with a starting adapter: plain LoRA only")
def reference_base(cfg: RunConfig) -> Iterator[Finding]:
    """The base as reference, while the policy starts from an adapter: the reference adapter's lora_B is zeroed
    after TRL copies the start into it (W + A·0 = W). DoRA's magnitudes, modules_to_save copies and trainable
    tokens have no such zero."""
    if not row_of(cfg.run.method).reference or not cfg.model.adapter or cfg.model.reference != "base":
        return
    extra = [
        name
        for name, on in (
            ("DoRA", cfg.lora.use_dora),
            ("modules_to_save", bool(cfg.peft.get("modules_to_save"))),
            ("trainable_token_indices", bool(cfg.peft.get("trainable_token_indices"))),
        )
        if on
    ]
    if extra:
        yield error(
            cfg,
            "FT122",
            "model.reference",
            f"--reference base resets the reference adapter to the base by zeroing its lora_B; the starting "
            f"adapter's {', '.join(extra)} cannot be reset that way",
            "--reference adapter (the starting adapter is the reference)",
        )


@rule("FT123", "method", "router_aux_loss_coef on a model without experts", decided=True)
def router_aux(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    if not compares(cfg) or cfg.training.get("router_aux_loss_coef") is None:
        return
    from fsdp_tune.sources.moe import has_experts

    config = d.model.config
    if config is not None and not has_experts(config) and not has_experts(config.get("text_config") or {}):
        yield error(
            cfg,
            "FT123",
            "training.router_aux_loss_coef",
            f"{config.get('model_type')} has no experts: the trainer refuses a router loss on it",
            "drop --router_aux_loss_coef",
        )


@rule("FT124", "method", "a data format of another kind of method (SFT data under DPO, pairs under SFT, ...)")
def format_for_method(cfg: RunConfig) -> Iterator[Finding]:
    from fsdp_tune.sources.formats import KINDS, PREFERENCE_KINDS, PROMPT_KINDS

    # the row's data kind -> (its formats, what people call it, the methods that train on it)
    kinds = {
        "sft": (KINDS, "supervised fine-tuning", "--method sft"),
        "pairs": (PREFERENCE_KINDS, "preference", "--method dpo, kto or reward"),
        "unpaired": (PREFERENCE_KINDS, "preference", "--method dpo, kto or reward"),
        "prompts": (PROMPT_KINDS, "prompt-only", "--method grpo"),
    }
    right, named, _ = kinds[row_of(cfg.run.method).data]
    asked = [("data.dataset_format", cfg.data.dataset_format)]
    asked += [("data.datasets", e.get("format")) for e in cfg.data.datasets or () if isinstance(e, dict)]
    for path, value in asked:
        other = next((k for k in kinds.values() if value in k[0] and k[0] is not right), None)
        if other is not None:
            yield error(
                cfg,
                "FT124",
                path,
                f"format {value} is {other[1]} data; --method {cfg.run.method} trains on {named} data ({other[2]} "
                "trains on it)",
                f"a format of {', '.join(right)} (or auto), or another --method",
            )
