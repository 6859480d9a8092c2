"""The ranks' hook of each training method (config/methods.py holds its row: everything else about it): the TRL
config and trainer classes, how its data is prepared, and the columns of the sequences its trainer tokenizes (for
what it cuts at max_seq_len). Everything else is the recipe's, shared by every method (worker/recipe.py): the
tokenizer, the model on its loading path, the trainer built with the same arguments and callbacks, fsdp-tune's
saving mixed into the trainer class (training/trainer.py), the adapter check and the summary.

A method is added as a row in config/methods.py and a hook here: its config and trainer classes (TRL's take the
constructor arguments the recipe passes: model, args, train_dataset, eval_dataset, processing_class, peft_config,
callbacks) and a `prepare(spec, tokenizer) -> Prepared` for its data (a new kind of data: a new preparation); a
trainer that takes more (GRPO's reward functions) says so in `trainer_kwargs`, and what it needs under FSDP that TRL
does not do is a class mixed in before it (`mixin`, whose own constructor keywords come from `trainer_kwargs`).
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

from fsdp_tune.config.methods import ROWS, MethodRow
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.worker.data.preference import prepare_preference
from fsdp_tune.worker.data.prepare import Prepared, prepare
from fsdp_tune.worker.data.prompts import prepare_prompts
from fsdp_tune.worker.training.grpo import GrpoOnFsdp
from fsdp_tune.worker.training.rewards import reward_kwargs


@dataclass(frozen=True)
class Method:
    config_class: type  # TrainingArguments subclass: the spec's trainer_args are its keyword arguments
    trainer_class: type  # the TRL trainer; fsdp-tune's saving is mixed in (training/trainer.py fsdp_trainer)
    # (spec, tokenizer, processor or None) -> the train and eval datasets, and a report
    prepare: Callable[[RankSpec, Any, Any], Prepared]
    # the tokenized columns each sequence of a row is made of, as the trainer builds them (None: SFT's rows);
    # worker/data/lengths.py counts what the trainer cuts of them
    sequences: tuple[tuple[str, ...], ...] | None = None
    # (spec, tokenizer, step) -> the trainer's further constructor arguments; step() is the global step
    trainer_kwargs: Callable[[RankSpec, Any, Callable[[], int | None]], dict[str, Any]] = lambda spec, tok, step: {}
    mixin: type | None = None  # mixed in before trainer_class (training/trainer.py fsdp_trainer)


def _grpo_kwargs(spec: RankSpec, tokenizer, step) -> dict[str, Any]:
    rank = spec.lora["r"] if spec.lora else None
    return {**reward_kwargs(spec, tokenizer, step), "grpo": spec.grpo, "lora_rank": rank}


HOOKS: dict[str, Method] = {
    # converted and tokenized once, with answer masks (worker/data/prepare.py)
    "sft": Method(SFTConfig, SFTTrainer, prepare),
    # TRL tokenizes the preference columns prepared once (worker/data/preference.py); DPO's and KTO's reference is a
    # frozen adapter beside the policy's (worker/loading/reference.py), or the base on the transformers path
    "dpo": Method(
        DPOConfig, DPOTrainer, prepare_preference, (("prompt_ids", "chosen_ids"), ("prompt_ids", "rejected_ids"))
    ),
    "kto": Method(KTOConfig, KTOTrainer, prepare_preference, (("prompt_ids", "completion_ids"),)),
    "reward": Method(RewardConfig, RewardTrainer, prepare_preference, (("chosen_ids",), ("rejected_ids",))),
    # prompts prepared once (worker/data/prompts.py); the completions generated on the ranks and scored by the spec's
    # rewards (training/rewards.py), generation synced across ranks, the reference as the adapter off (training/grpo.py)
    "grpo": Method(GRPOConfig, GRPOTrainer, prepare_prompts, trainer_kwargs=_grpo_kwargs, mixin=GrpoOnFsdp),
}


def method_of(spec: RankSpec) -> tuple[Method, MethodRow]:
    """The spec's method: its hook here and its row."""
    name = spec.method.name
    if name not in HOOKS or name not in ROWS:
        raise ValueError(f"training method {name!r} is not one this fsdp-tune runs ({', '.join(HOOKS)})")
    return HOOKS[name], ROWS[name]
