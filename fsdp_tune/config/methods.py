"""Training methods as the launcher knows them (no trl import): which TRL config each trains with and that
config's fields, read from training_fields.json (scripts/gen_training_fields.py writes SFTConfig's fields whole and
DPOConfig's, KTOConfig's, RewardConfig's and GRPOConfig's as they differ from it).

    sft     SFTTrainer     supervised fine-tuning (the default)
    dpo     DPOTrainer     preference pairs against a reference (the starting adapter, or the base)
    kto     KTOTrainer     unpaired desirable / undesirable answers against a reference
    reward  RewardTrainer  a sequence-classification head that scores the preferred answer higher
    grpo    GRPOTrainer    online RL: completions generated on the ranks, scored by reward functions

The ranks' side of a method (its trainer class, data preparation, metrics) is worker/training/methods.py.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

SFT, DPO, KTO, REWARD, GRPO = "sft", "dpo", "kto", "reward", "grpo"
METHODS = (SFT, DPO, KTO, REWARD, GRPO)
PREFERENCE = (DPO, KTO, REWARD)  # the methods that train on preference data (sources/preference.py)
WITH_REFERENCE = (DPO, KTO)  # the methods that compare the policy with a reference model every step
ONLINE = (GRPO,)  # the methods that generate their completions and score them with rewards (sources/prompts.py)
# what each method's trainer does that the rules speak of (rules/method.py), one tuple per trait:
TOGGLES_CHECKPOINTING = (DPO, KTO, GRPO)  # switches the Trainer's gradient checkpointing off and on every step
FUSED_HEAD = (DPO, KTO, GRPO)  # log-probabilities from lm_head.weight directly: an adapter on lm_head is refused
LORA_ONLY = (DPO, KTO, REWARD, GRPO)  # run by fsdp-tune with LoRA only (FT118)
DENSE_ROUTER_REFUSED = (DPO, KTO, GRPO)  # refuses router_aux_loss_coef on a model without experts
DATA = {SFT: "sft", DPO: "preference", KTO: "preference", REWARD: "preference", GRPO: "prompts"}  # the data it reads
CONFIG_CLASS = {SFT: "SFTConfig", DPO: "DPOConfig", KTO: "KTOConfig", REWARD: "RewardConfig", GRPO: "GRPOConfig"}
TITLE = {
    SFT: "SFT (supervised fine-tuning, TRL's SFTTrainer)",
    DPO: "DPO (direct preference optimization, TRL's DPOTrainer)",
    KTO: "KTO (Kahneman-Tversky optimization on unpaired answers, TRL's KTOTrainer)",
    REWARD: "reward model (a scalar head trained on preference pairs, TRL's RewardTrainer)",
    GRPO: "GRPO (online RL: completions generated and scored by rewards, TRL's GRPOTrainer)",
}


@cache
def table() -> dict[str, Any]:
    text = resources.files("fsdp_tune.config").joinpath("training_fields.json").read_text()
    return json.loads(text)


@cache
def fields_of(method: str = SFT) -> dict[str, dict[str, Any]]:
    """The method's config fields: name -> {"kind", "default", "choices"?}."""
    sft = table()["fields"]
    if method == SFT or method not in METHODS:
        return sft
    own = table()["methods"][method]
    absent = set(own["absent"])
    return {**{k: v for k, v in sft.items() if k not in absent}, **own["fields"]}


@cache
def all_fields() -> frozenset[str]:
    """Every field some method's config takes: each is a flag (a method that lacks it refuses it, FT110)."""
    return frozenset(name for method in METHODS for name in fields_of(method))


def methods_taking(name: str) -> tuple[str, ...]:
    """The methods whose config has field `name`."""
    return tuple(m for m in METHODS if name in fields_of(m))


@cache
def flag_kind(name: str) -> str:
    """The kind the flag parser reads a training field's words as: a list when some method's config takes a
    list (`--loss_type sigmoid sft` is DPO's), else its kind where the configs agree, else 'any'."""
    kinds = {fields_of(m)[name]["kind"] for m in methods_taking(name)}
    for kind in ("list", "float_list"):
        if kind in kinds:
            return kind
    return kinds.pop() if len(kinds) == 1 else "any"


def f_divergence_losses() -> tuple[str, ...]:
    """DPO's loss types that take a non-default f_divergence_type (read from TRL's help text)."""
    return tuple(table()["methods"][DPO].get("f_divergence_losses", ()))


# the method's own training metrics as TRL logs them (metrics.jsonl), with what people call them: the summary keeps
# their first and last values, `report` prints and plots them (the first two: one panel each); a `*` stands for
# each name TRL logs there (GRPO: one per reward function), `{}` in the label for that name
METRICS: dict[str, tuple[tuple[str, str], ...]] = {
    SFT: (),
    DPO: (
        ("rewards/accuracies", "reward accuracy"),
        ("rewards/margins", "reward margin"),
        ("rewards/chosen", "chosen reward"),
        ("rewards/rejected", "rejected reward"),
    ),
    KTO: (
        ("kl", "KL"),
        ("rewards/margins", "reward margin"),
        ("rewards/chosen", "chosen reward"),
        ("rewards/rejected", "rejected reward"),
    ),
    REWARD: (("accuracy", "accuracy"), ("margin", "margin")),
    GRPO: (
        ("reward", "reward"),
        ("completions/mean_length", "completion length"),
        ("kl", "KL"),
        ("rewards/*/mean", "{}"),
        ("reward_std", "reward std"),
    ),
}


def metric_keys(method: str, logged) -> list[tuple[str, str]]:
    """The method's metrics (METRICS) among the keys `logged`, a `*` row once for each key it matches."""
    out = []
    for key, label in METRICS.get(method, ()):
        if "*" not in key:
            out += [(key, label)] if key in logged else []
            continue
        head, _, tail = key.partition("*")
        for name in sorted(k for k in logged if k.startswith(head) and k.endswith(tail) and len(k) > len(key) - 1):
            out.append((name, label.format(name[len(head) : len(name) - len(tail)])))
    return out
