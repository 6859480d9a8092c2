"""dpo: the method's row (everything the launcher, the rules, the planner and the console read of it) and its own
check of its settings (FT111, the row's `checks`)."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.methods.row import PREFERENCE_REWARDS, MethodRow, Metric, Refused, Settings, Step


def loss_parameters(s: Settings) -> Iterator[Refused]:
    """What DPOTrainer refuses in its constructor on every rank (exo_pair without label smoothing, an
    f-divergence or WPO weighting with loss types that cannot take them) or only warns about (robust's smoothing
    outside [0, 0.5), where its loss divides by 1 - 2 * smoothing), and loss_weights' length (FT111): the check of
    every method whose config has DPOConfig's loss settings (tests/unit/test_method_checks.py)."""
    losses = s.loss_types
    smoothing = float(s.get("label_smoothing") or 0)
    if "exo_pair" in losses and smoothing <= 0:
        yield Refused(
            "FT111",
            "error",
            "training.loss_type",
            "exo_pair needs label_smoothing > 0",
            "--label_smoothing 1e-3 (EXO's)",
        )
    if "robust" in losses and not 0 <= smoothing < 0.5:
        message = f"robust reads label_smoothing as the chance a label flipped: it must be in [0, 0.5), got {smoothing}"
        yield Refused("FT111", "error", "training.label_smoothing", message, "--label_smoothing 0.1 (the paper's)")
    weights = s.get("loss_weights")
    if weights is not None and len(weights) != len(losses):
        message = f"{len(weights)} loss_weights for {len(losses)} loss types ({', '.join(losses)}): one weight each"
        hint = "--loss_weights " + " ".join(["1.0"] * len(losses))
        yield Refused("FT111", "error", "training.loss_weights", message, hint)
    divergence = s.get("f_divergence_type")
    refused = [x for x in losses if x not in s.f_divergence_losses]
    if divergence not in (None, "reverse_kl") and refused:
        takes = ", ".join(s.f_divergence_losses)
        message = f"f_divergence_type {divergence} applies to {takes}, not {', '.join(refused)}"
        yield Refused("FT111", "error", "training.f_divergence_type", message, "--f_divergence_type reverse_kl")
    sorting = [x for x in losses if x in ("aot", "aot_unpaired")]
    if s.get("use_weighting") and sorting:
        message = f"WPO weighting with {', '.join(sorting)}: those losses sort samples, misaligning per-pair weights"
        hint = "drop --use_weighting, or use another loss_type"
        yield Refused("FT111", "error", "training.use_weighting", message, hint)
    alpha = s.get("ld_alpha")
    if alpha is not None and not 0 <= alpha <= 1:
        yield Refused("FT111", "warning", "training.ld_alpha", f"LD-DPO's ld_alpha is a weight in [0, 1], got {alpha}")


ROW = MethodRow(
    "dpo",
    "DPO (direct preference optimization, TRL's DPOTrainer)",
    "DPOConfig",
    "DPOTrainer",
    data="pairs",
    reference=True,
    head="lm",
    packs=False,
    truncation="prompt",
    recompute_with_fsdp=True,
    step=Step(
        rows_with_grad=2,
        no_grad_after=1,
        no_grad_rows=2,
        describe="2 sequences per example (chosen, rejected) with gradients, and a reference forward on them",
        loss_over="sequences",
    ),
    fused_head=("log_probs", "entropy", "mean_logits", "is_top1"),
    metrics=(Metric("rewards/accuracies", "reward accuracy"), *PREFERENCE_REWARDS),
    progress=(Metric("rewards/accuracies", "reward acc", ".2f"), Metric("rewards/margins", "margin")),
    eval_metrics=(
        Metric("eval_loss", "loss", ".4f"),
        Metric("eval_rewards/accuracies", "reward accuracy"),
        Metric("eval_rewards/margins", "margin"),
    ),
    checks=(loss_parameters,),
)
