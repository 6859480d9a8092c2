"""grpo: the method's row (everything the launcher, the rules, the planner and the console read of it)."""

from __future__ import annotations

from fsdp_tune.methods.row import (
    GENERATING_EVAL,
    GENERATING_METRICS,
    GENERATING_PROGRESS,
    GENERATING_STEP,
    MethodRow,
)

# GRPO's reference (beta > 0) and its no-grad log-prob passes depend on its config, not on the method: they
# are GenerationSpec's (decide/method.py) and planner/generating.py's; the trainer toggles the Trainer's gradient
# checkpointing around every generation (recompute_with_fsdp)
ROW = MethodRow(
    "grpo",
    "GRPO (online RL: completions generated and scored by rewards, TRL's GRPOTrainer)",
    "GRPOConfig",
    "GRPOTrainer",
    data="prompts",
    reference=False,
    head="lm",
    packs=False,
    truncation="none",
    recompute_with_fsdp=True,
    step=GENERATING_STEP,
    fused_head=("log_probs", "entropy"),
    metrics=GENERATING_METRICS,
    progress=GENERATING_PROGRESS,
    eval_metrics=GENERATING_EVAL,
    panels=3,  # the reward (with each function's), the completion length, the KL
)
