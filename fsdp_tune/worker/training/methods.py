"""Training methods, one row each (RankSpec.method names the row): the TRL config and trainer classes, how the
method's data is prepared, and the evaluation metrics rank 0 shows. Everything else is the recipe's, shared by
every method (worker/recipe.py): the tokenizer, the model on its loading path, the trainer built with the
same arguments and callbacks, fsdp-tune's saving mixed into the trainer class (training/trainer.py), the
adapter check and the summary.

A method is added as one entry here: its config and trainer classes (TRL's DPOConfig/DPOTrainer take the same
constructor arguments the recipe passes: model, args, train_dataset, eval_dataset, processing_class,
peft_config, callbacks), a `prepare(spec, tokenizer) -> Prepared` for its data, and its metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer, RewardConfig, RewardTrainer, SFTConfig, SFTTrainer

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.worker.data.preference import prepare_preference
from fsdp_tune.worker.data.prepare import Prepared, prepare
from fsdp_tune.worker.training.progress import Metric


@dataclass(frozen=True)
class Method:
    config_class: type  # TrainingArguments subclass: the spec's trainer_args are its keyword arguments
    trainer_class: type  # the TRL trainer; fsdp-tune's saving is mixed in (training/trainer.py fsdp_trainer)
    prepare: Callable[[RankSpec, Any], Prepared]  # (spec, tokenizer) -> the train and eval datasets, and a report
    metrics: tuple[Metric, ...]  # shown after each evaluation, those the trainer reported
    progress: tuple[Metric, ...] = ()  # shown on the progress line from each training log, those reported


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

METHODS: dict[str, Method] = {"sft": SFT, "dpo": DPO, "kto": KTO, "reward": REWARD}


def method_of(spec: RankSpec) -> Method:
    if spec.method not in METHODS:
        raise ValueError(f"training method {spec.method!r} is not one this fsdp-tune runs ({', '.join(METHODS)})")
    return METHODS[spec.method]
