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

from trl import SFTConfig, SFTTrainer

from fsdp_tune.launch.spec import RankSpec
from fsdp_tune.worker.data.prepare import Prepared, prepare
from fsdp_tune.worker.training.progress import Metric


@dataclass(frozen=True)
class Method:
    config_class: type  # TrainingArguments subclass: the spec's trainer_args are its keyword arguments
    trainer_class: type  # the TRL trainer; fsdp-tune's saving is mixed in (training/trainer.py fsdp_trainer)
    prepare: Callable[[RankSpec, Any], Prepared]  # (spec, tokenizer) -> the train and eval datasets, and a report
    metrics: tuple[Metric, ...]  # shown after each evaluation, those the trainer reported


SFT = Method(
    config_class=SFTConfig,
    trainer_class=SFTTrainer,
    prepare=prepare,  # converted and tokenized once, with answer masks (worker/data/prepare.py)
    metrics=(Metric("eval_loss", "loss", ".4f"), Metric("eval_mean_token_accuracy", "token accuracy", ".3f")),
)

METHODS: dict[str, Method] = {"sft": SFT}


def method_of(spec: RankSpec) -> Method:
    if spec.method not in METHODS:
        raise ValueError(f"training method {spec.method!r} is not one this fsdp-tune runs ({', '.join(METHODS)})")
    return METHODS[spec.method]
