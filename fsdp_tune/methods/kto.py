"""kto: the method's row (everything the launcher, the rules, the planner and the console read of it) and its own
check of its settings (FT113, the row's `checks`)."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.methods.row import PREFERENCE_REWARDS, MethodRow, Metric, Refused, Settings, Step


def kl_batches(s: Settings) -> Iterator[Refused]:
    """KTOTrainer pairs each completion with the next one's prompt within a micro-batch to estimate the KL term
    (kto_trainer.py: rotated within chunks of per_device_train_batch_size), so it refuses a batch of 1 and any
    order but sequential (FT113); apo_zero_unpaired has no KL term."""
    if "apo_zero_unpaired" in s.loss_types:
        return
    if int(s.get("per_device_train_batch_size")) < 2:  # KTOConfig's default when unset (Settings)
        message = "kto estimates its KL term from the other examples of a micro-batch: a batch of 1 has none"
        hint = "--per_device_train_batch_size 2"
        yield Refused("FT113", "error", "training.per_device_train_batch_size", message, hint)
    if s.get("train_sampling_strategy") != "sequential":
        message = (
            f"train_sampling_strategy {s.get('train_sampling_strategy')}: kto pairs neighbouring rows for its KL "
            "term, so KTOTrainer takes sequential order only (fsdp-tune shuffles the rows once, with the seed)"
        )
        hint = "drop --train_sampling_strategy"
        yield Refused("FT113", "error", "training.train_sampling_strategy", message, hint)


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
    checks=(kl_batches,),
)
