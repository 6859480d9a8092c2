"""Training methods, one row each (RankSpec.method names the row): the TRL config and trainer classes, how the
method's data is prepared, and the evaluation metrics rank 0 shows. Everything else is the recipe's, shared by
every method (worker/recipe.py): the tokenizer, the model on its loading path, the trainer built with the
same arguments and callbacks, fsdp-tune's saving mixed into the trainer class (training/trainer.py), the
adapter check and the summary.

A method is added as one entry here: its config and trainer classes (TRL's DPOConfig/DPOTrainer take the same
constructor arguments the recipe passes: model, args, train_dataset, eval_dataset, processing_class,
peft_config, callbacks), a `prepare(spec, tokenizer) -> Prepared` for its data, and its metrics; a method whose
trainer takes more (GRPO's reward functions) says so in `trainer_kwargs`, and what its trainer needs under FSDP that
TRL does not do is a class mixed in before it (`mixin`, its constructor's own keywords from `trainer_kwargs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trl import (
    DPOConfig,
    DPOTrainer,
    GRPOConfig,
    GRPOTrainer,
    KTOConfig,
    KTOTrainer,
    RewardConfig,
    RewardTrainer,
    SFTConfig,
    SFTTrainer,
)

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.worker.data.preference import prepare_preference
from fsdp_tune.worker.data.prepare import Prepared, prepare
from fsdp_tune.worker.data.prompts import prepare_prompts
from fsdp_tune.worker.training.grpo import GrpoOnFsdp
from fsdp_tune.worker.training.progress import Metric
from fsdp_tune.worker.training.rewards import reward_kwargs


@dataclass(frozen=True)
class Method:
    config_class: type  # TrainingArguments subclass: the spec's trainer_args are its keyword arguments
    trainer_class: type  # the TRL trainer; fsdp-tune's saving is mixed in (training/trainer.py fsdp_trainer)
    prepare: Callable[[RankSpec, Any], Prepared]  # (spec, tokenizer) -> the train and eval datasets, and a report
    metrics: tuple[Metric, ...]  # shown after each evaluation, those the trainer reported
    progress: tuple[Metric, ...] = ()  # shown on the progress line from each training log, those reported
    # (spec, tokenizer, step) -> the trainer's further constructor arguments; step() is the global step
    trainer_kwargs: Callable[[RankSpec, Any, Callable[[], int | None]], dict[str, Any]] = lambda spec, tok, step: {}
    mixin: type | None = None  # mixed in before trainer_class (training/trainer.py fsdp_trainer)


SFT = Method(
    config_class=SFTConfig,
    trainer_class=SFTTrainer,
    prepare=prepare,  # converted and tokenized once, with answer masks (worker/data/prepare.py)
    metrics=(Metric("eval_loss", "loss", ".4f"), Metric("eval_mean_token_accuracy", "token accuracy", ".3f")),
)

# DPO and KTO: TRL tokenizes the preference columns prepared once (worker/data/preference.py); their reference is
# a frozen adapter beside the policy's (worker/loading/reference.py), or the base on the transformers path
DPO = Method(
    config_class=DPOConfig,
    trainer_class=DPOTrainer,
    prepare=prepare_preference,
    metrics=(
        Metric("eval_loss", "loss", ".4f"),
        Metric("eval_rewards/accuracies", "reward accuracy", ".3f"),
        Metric("eval_rewards/margins", "margin", ".3f"),
    ),
    progress=(Metric("rewards/accuracies", "reward acc", ".2f"), Metric("rewards/margins", "margin", ".3f")),
)
KTO = Method(
    config_class=KTOConfig,
    trainer_class=KTOTrainer,
    prepare=prepare_preference,
    metrics=(
        Metric("eval_loss", "loss", ".4f"),
        Metric("eval_kl", "kl", ".3f"),
        Metric("eval_rewards/margins", "margin", ".3f"),
    ),
    progress=(Metric("kl", "kl", ".3f"), Metric("rewards/margins", "margin", ".3f")),
)
REWARD = Method(
    config_class=RewardConfig,
    trainer_class=RewardTrainer,
    prepare=prepare_preference,
    metrics=(
        Metric("eval_loss", "loss", ".4f"),
        Metric("eval_accuracy", "accuracy", ".3f"),
        Metric("eval_margin", "margin", ".3f"),
    ),
    progress=(Metric("accuracy", "acc", ".2f"), Metric("margin", "margin", ".3f")),
)


def _grpo_kwargs(spec: RankSpec, tokenizer, step) -> dict[str, Any]:
    rank = spec.lora["r"] if spec.lora else None
    return {**reward_kwargs(spec, tokenizer, step), "grpo": spec.grpo, "lora_rank": rank}


# GRPO: prompts prepared once (worker/data/prompts.py); the completions generated on the ranks and scored by the
# spec's rewards (training/rewards.py), with generation synced across ranks and the reference as the adapter
# switched off (training/grpo.py)
GRPO = Method(
    config_class=GRPOConfig,
    trainer_class=GRPOTrainer,
    prepare=prepare_prompts,
    metrics=(Metric("eval_reward", "reward", ".3f"), Metric("eval_completions/mean_length", "length", ".1f")),
    progress=(
        Metric("reward", "reward", ".3f"),
        Metric("completions/mean_length", "length", ".1f"),
        Metric("kl", "kl", ".4f"),
    ),
    trainer_kwargs=_grpo_kwargs,
    mixin=GrpoOnFsdp,
)

METHODS: dict[str, Method] = {"sft": SFT, "dpo": DPO, "kto": KTO, "reward": REWARD, "grpo": GRPO}


def method_of(spec: RankSpec) -> Method:
    if spec.method not in METHODS:
        raise ValueError(f"training method {spec.method!r} is not one this fsdp-tune runs ({', '.join(METHODS)})")
    return METHODS[spec.method]
