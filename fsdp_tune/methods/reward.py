"""reward: the method's row (everything the launcher, the rules, the planner and the console read of it)."""

from __future__ import annotations

from fsdp_tune.methods.row import MethodRow, Metric, Step

ROW = MethodRow(
    "reward",
    "reward model (a scalar head trained on preference pairs, TRL's RewardTrainer)",
    "RewardConfig",
    "RewardTrainer",
    data="pairs",
    reference=False,
    head="score",
    packs=False,
    truncation="whole",
    recompute_with_fsdp=False,
    step=Step(rows_with_grad=2, describe="2 sequences per example (chosen, rejected) through a one-number score head"),
    metrics=(Metric("accuracy", "accuracy"), Metric("margin", "margin")),
    progress=(Metric("accuracy", "acc", ".2f"), Metric("margin", "margin")),
    eval_metrics=(
        Metric("eval_loss", "loss", ".4f"),
        Metric("eval_accuracy", "accuracy"),
        Metric("eval_margin", "margin"),
    ),
)
