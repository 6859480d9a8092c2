"""sft: the method's row (everything the launcher, the rules, the planner and the console read of it)."""

from __future__ import annotations

from fsdp_tune.methods.row import MethodRow, Metric, Step

ROW = MethodRow(
    "sft",
    "SFT (supervised fine-tuning, TRL's SFTTrainer)",
    "SFTConfig",
    "SFTTrainer",
    data="sft",
    reference=False,
    head="lm",
    packs=True,
    truncation="sft",
    recompute_with_fsdp=False,
    step=Step(),
    fused_head=("log_probs", "entropy", "is_top1"),
    eval_metrics=(Metric("eval_loss", "loss", ".4f"), Metric("eval_mean_token_accuracy", "token accuracy")),
    named=False,
    context_parallel=True,
    expert_parallel=True,
)
