"""rloo: TRL 1.16's RLOOTrainer, online RL like GRPO (a generating method: completions generated on the ranks from
prompts and scored by the rewards, the reference as the adapter off), with its own loss: each completion's advantage
is its reward less the mean of the other completions of its prompt (the leave-one-out baseline), the KL term folded
into the reward (rloo_trainer.py _generate_and_score_completions). What differs from GRPO is its config's, read from
training_fields.json: num_generations 2 and beta 0.05 by default (so a LoRA run has a reference), no loss_type
(normalize_advantages, reward_clip_range instead); what differs in its trainer is the row's copies_reference."""

from __future__ import annotations

from fsdp_tune.methods.row import MethodRow, Metric, Step

ROW = MethodRow(
    "rloo",
    "RLOO (online RL: completions generated and scored by rewards, a leave-one-out baseline, TRL's RLOOTrainer)",
    "RLOOConfig",
    "RLOOTrainer",
    data="prompts",
    reference=False,  # its KL term's reference is its config's (beta > 0): GenerationSpec.reference
    # RLOOTrainer copies a PEFT model's adapter into "ref" whatever beta (rloo_trainer.py:398-426): that copy, made
    # before sharding as DPO's, is its reference (a fresh adapter's copy: the base)
    copies_reference=True,
    head="lm",
    packs=False,
    truncation="none",
    recompute_with_fsdp=True,  # the trainer toggles the Trainer's gradient checkpointing around generation, as GRPO's
    step=Step(
        describe="completions generated on the ranks, then trained on as SFT rows (planner/grpo.py: the generation "
        "and the log-prob passes before it)",
    ),
    fused_head=("log_probs", "entropy"),
    metrics=(
        Metric("reward", "reward"),
        Metric("completions/mean_length", "completion length", ".1f"),
        Metric("kl", "KL", ".4f"),
        Metric("rewards/*/mean", "{}"),
        Metric("reward_std", "reward std"),
        Metric("timing/generation_s", "generation s", ".2f"),  # worker/training/generating.py
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
