"""dpo: the method's row (everything the launcher, the rules, the planner and the console read of it)."""

from __future__ import annotations

from fsdp_tune.methods.row import PREFERENCE_REWARDS, MethodRow, Metric, Step

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
)
