"""rloo: TRL 1.16's RLOOTrainer, online RL like GRPO (a generating method: completions generated on the ranks from
prompts and scored by the rewards; its reference a frozen copy of the starting adapter, copies_reference below),
with its own loss: each completion's advantage
is its reward less the mean of the other completions of its prompt (the leave-one-out baseline), the KL term folded
into the reward (rloo_trainer.py _generate_and_score_completions). What differs from GRPO is its config's, read from
training_fields.json: num_generations 2 and beta 0.05 by default (so a LoRA run has a reference), no loss_type
(normalize_advantages, reward_clip_range instead); what differs in its trainer is the row's copies_reference."""

from __future__ import annotations

from fsdp_tune.methods.row import (
    GENERATING_EVAL,
    GENERATING_METRICS,
    GENERATING_PROGRESS,
    GENERATING_STEP,
    MethodRow,
)

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
    step=GENERATING_STEP,
    fused_head=("log_probs", "entropy"),
    metrics=GENERATING_METRICS,
    progress=GENERATING_PROGRESS,
    eval_metrics=GENERATING_EVAL,
    panels=3,  # the reward (with each function's), the completion length, the KL
)
