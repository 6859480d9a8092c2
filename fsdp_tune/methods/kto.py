"""kto: the method's row (everything the launcher, the rules, the planner and the console read of it)."""

from __future__ import annotations

from fsdp_tune.methods.row import PREFERENCE_REWARDS, MethodRow, Metric, Step

ROW = MethodRow(
    "kto",
    "KTO (Kahneman-Tversky optimization on unpaired answers, TRL's KTOTrainer)",
    "KTOConfig",
    "KTOTrainer",
    data="unpaired",
    reference=True,
    head="lm",
    packs=False,
    truncation="prompt",
    recompute_with_fsdp=True,
    step=Step(
        rows_with_grad=1,
        no_grad_before=1,
        no_grad_after=2,
        no_grad_rows=1,
        describe="1 sequence per example with gradients, 3 forwards without (KL, reference)",
        loss_over="sequences",
    ),
    fused_head=("log_probs", "entropy", "mean_logits"),
    metrics=(Metric("kl", "KL"), *PREFERENCE_REWARDS),
    progress=(Metric("kl", "kl"), Metric("rewards/margins", "margin")),
    eval_metrics=(
        Metric("eval_loss", "loss", ".4f"),
        Metric("eval_kl", "kl"),
        Metric("eval_rewards/margins", "margin"),
    ),
    kl_from_batch=True,
)
