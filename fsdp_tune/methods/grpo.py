"""grpo: the method's row (everything the launcher, the rules, the planner and the console read of it)."""

from __future__ import annotations

from fsdp_tune.methods.row import MethodRow, Metric, Step

# GRPO's reference (beta > 0) and its no-grad log-prob passes depend on its config, not on the method: they
# are GenerationSpec's (decide/method.py) and planner/grpo.py's; the trainer toggles the Trainer's gradient
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
    step=Step(
        describe="completions generated on the ranks, then trained on as SFT rows (planner/grpo.py: the "
        "generation and the log-prob passes before it)",
    ),
    fused_head=("log_probs", "entropy"),
    # and each reward function's own mean: a `*` row stands for every name TRL logs there (metric_keys)
    metrics=(
        Metric("reward", "reward"),
        Metric("completions/mean_length", "completion length", ".1f"),
        Metric("kl", "KL", ".4f"),
        Metric("rewards/*/mean", "{}"),
        Metric("reward_std", "reward std"),
        # the step's time split (worker/training/generating.py): TRL's step_time holds generation and scoring
        Metric("timing/generation_s", "generation s", ".2f"),
        Metric("timing/scoring_s", "scoring s", ".2f"),
        Metric("step_time", "step s", ".2f"),
    ),
    progress=(
        Metric("reward", "reward"),
        Metric("completions/mean_length", "length", ".1f"),
        Metric("kl", "kl", ".4f"),
    ),
    eval_metrics=(Metric("eval_reward", "reward"), Metric("eval_completions/mean_length", "length", ".1f")),
    panels=3,  # the reward (with each function's), the completion length, the KL
)
