"""Training methods, one torch-free row each: everything the launcher, the rules, the planner, the trace, the
console and `report` need to know about a method, so none of them branches on its name.

    sft     SFTTrainer     supervised fine-tuning (the default)
    dpo     DPOTrainer     preference pairs against a reference (the starting adapter, or the base)
    kto     KTOTrainer     unpaired desirable / undesirable answers against a reference
    reward  RewardTrainer  a sequence-classification head that scores the preferred answer higher
    grpo    GRPOTrainer    online RL: completions generated on the ranks, scored by reward functions

A method is added as a row here and a hook on the ranks (worker/training/methods.py: the TRL config and trainer
classes, its data preparation and its trainer arguments); tests/unit/test_method_rows.py walks every row to the
rank. Each config's fields are read from training_fields.json (scripts/gen_training_fields.py writes SFTConfig's
whole and the other methods' configs as they differ from it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

SFT, DPO, KTO, REWARD, GRPO = "sft", "dpo", "kto", "reward", "grpo"

# the rows a method trains on (sources/ detects them): SFT's rows, preference pairs, KTO's unpaired rows (pairs
# become two unpaired rows: worker/data/preference.py), or prompts it generates the completions of (sources/prompts.py)
DataKind = Literal["sft", "pairs", "unpaired", "prompts"]
# what the model ends in: the language-model head, or a one-number score head (AutoModelForSequenceClassification)
Head = Literal["lm", "score"]
# what the trainer leaves out at max_seq_len, and how rank 0 counts it (worker/recipe.py report_truncation):
# "sft": sequences cut, none dropped; "prompt": sequences cut, rows whose prompt alone reaches it dropped;
# "whole": pairs with a sequence longer than it dropped (RewardTrainer); "none": the trainer cuts nothing (GRPO: rank
# 0 left out the prompts that leave no room for a completion, worker/data/prompts.py)
Truncation = Literal["sft", "prompt", "whole", "none"]


@dataclass(frozen=True)
class Metric:
    """A metric as the trainer logs it (metrics.jsonl, or `eval_`-prefixed after an evaluation), the name people
    call it, and how it is printed."""

    key: str
    label: str
    fmt: str = ".3f"


@dataclass(frozen=True)
class Step:
    """What one micro-batch of the method computes (pure, read from TRL 1.16), for the memory plan, the step time
    and `plan --trace`."""

    rows_with_grad: int = 1  # sequences per example whose activations are kept for backward (DPO: chosen, rejected)
    no_grad_before: int = 0  # forwards without gradients before the policy's (KTO's KL forward of the policy)
    no_grad_after: int = 0  # ... and after it, while the policy's activations wait (DPO's reference, KTO's two)
    no_grad_rows: int = 0  # sequences per example in each of them
    describe: str = ""  # one line for the plan
    # what the loss reduces (`plan --trace`'s stand-in): each token's log-probability (SFT's cross-entropy), or each
    # sequence's summed log-probability (the preference losses)
    loss_over: Literal["tokens", "sequences"] = "tokens"

    @property
    def no_grad_forwards(self) -> int:
        return self.no_grad_before + self.no_grad_after


@dataclass(frozen=True)
class MethodRow:
    name: str
    title: str
    config_class: str  # TRL's config class: its fields are the method's flags (training_fields.json)
    trainer_class: str  # TRL's trainer class (the ranks' hook holds the class itself)
    data: DataKind
    reference: bool  # compares the policy with a reference every step: a frozen "ref" adapter, or the adapter off
    head: Head
    packs: bool  # the trainer can pack sequences (--packing)
    truncation: Truncation
    # TRL's default gradient_checkpointing=True replaced by FSDP's activation checkpointing (FT116): the trainer
    # toggles the Trainer's around its reference forwards, which leaks a hook per step (decide/method_defaults.py)
    recompute_with_fsdp: bool
    step: Step
    # what the trainer asks of TRL's fused LM head (add_fused_lm_head's outputs; `plan --trace` installs it as the
    # trainer's __init__ does); empty for a score head
    fused_head: tuple[str, ...] = ()
    metrics: tuple[Metric, ...] = ()  # its own training metrics: the summary's first and last, `report`'s panels
    progress: tuple[Metric, ...] = ()  # shown on the progress line, from each training log
    eval_metrics: tuple[Metric, ...] = (Metric("eval_loss", "loss", ".4f"),)  # rank 0's line after an evaluation
    panels: int = 2  # how many of its first metrics `report` plots, a panel each (tools/report.py)

    @property
    def preference(self) -> bool:
        """It trains on preference data (pairs, or unpaired rows), not SFT rows."""
        return self.data in ("pairs", "unpaired")

    @property
    def generates(self) -> bool:
        """It generates its completions from prompts and scores them with rewards (online RL: GRPO)."""
        return self.data == "prompts"


_MARGIN = Metric("rewards/margins", "reward margin")
_CHOSEN, _REJECTED = Metric("rewards/chosen", "chosen reward"), Metric("rewards/rejected", "rejected reward")

ROWS: dict[str, MethodRow] = {
    row.name: row
    for row in (
        MethodRow(
            SFT,
            "SFT (supervised fine-tuning, TRL's SFTTrainer)",
            "SFTConfig",
            "SFTTrainer",
            data="sft",
            reference=False,
            head="lm",
            packs=True,
            truncation="sft",
            recompute_with_fsdp=False,
            step=Step(),
            fused_head=("log_probs", "entropy", "is_top1"),
            eval_metrics=(Metric("eval_loss", "loss", ".4f"), Metric("eval_mean_token_accuracy", "token accuracy")),
        ),
        MethodRow(
            DPO,
            "DPO (direct preference optimization, TRL's DPOTrainer)",
            "DPOConfig",
            "DPOTrainer",
            data="pairs",
            reference=True,
            head="lm",
            packs=False,
            truncation="prompt",
            recompute_with_fsdp=True,
            step=Step(
                rows_with_grad=2,
                no_grad_after=1,
                no_grad_rows=2,
                describe="2 sequences per example (chosen, rejected) with gradients, and a reference forward on them",
                loss_over="sequences",
            ),
            fused_head=("log_probs", "entropy", "mean_logits", "is_top1"),
            metrics=(Metric("rewards/accuracies", "reward accuracy"), _MARGIN, _CHOSEN, _REJECTED),
            progress=(Metric("rewards/accuracies", "reward acc", ".2f"), Metric("rewards/margins", "margin")),
            eval_metrics=(
                Metric("eval_loss", "loss", ".4f"),
                Metric("eval_rewards/accuracies", "reward accuracy"),
                Metric("eval_rewards/margins", "margin"),
            ),
        ),
        MethodRow(
            KTO,
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
            metrics=(Metric("kl", "KL"), _MARGIN, _CHOSEN, _REJECTED),
            progress=(Metric("kl", "kl"), Metric("rewards/margins", "margin")),
            eval_metrics=(
                Metric("eval_loss", "loss", ".4f"),
                Metric("eval_kl", "kl"),
                Metric("eval_rewards/margins", "margin"),
            ),
        ),
        MethodRow(
            REWARD,
            "reward model (a scalar head trained on preference pairs, TRL's RewardTrainer)",
            "RewardConfig",
            "RewardTrainer",
            data="pairs",
            reference=False,
            head="score",
            packs=False,
            truncation="whole",
            recompute_with_fsdp=False,
            step=Step(
                rows_with_grad=2, describe="2 sequences per example (chosen, rejected) through a one-number score head"
            ),
            metrics=(Metric("accuracy", "accuracy"), Metric("margin", "margin")),
            progress=(Metric("accuracy", "acc", ".2f"), Metric("margin", "margin")),
            eval_metrics=(
                Metric("eval_loss", "loss", ".4f"),
                Metric("eval_accuracy", "accuracy"),
                Metric("eval_margin", "margin"),
            ),
        ),
        # GRPO's reference (beta > 0) and its no-grad log-prob passes depend on its config, not on the method: they
        # are GrpoSpec's (decide/method.py) and planner/grpo.py's; the trainer toggles the Trainer's gradient
        # checkpointing around every generation (recompute_with_fsdp)
        MethodRow(
            GRPO,
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
                # the step's time split (worker/training/grpo.py): TRL's step_time holds generation and scoring
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
        ),
    )
}
METHODS = tuple(ROWS)


def row_of(method: str) -> MethodRow:
    """The method's row (SFT's for a name no row has: the config's choices refuse it first, FT010)."""
    return ROWS.get(method, ROWS[SFT])


def metric_keys(row: MethodRow, logged) -> list[tuple[str, str]]:
    """(key, label) of the row's metrics among the keys `logged`; a `*` in a key once for each logged key it
    matches, `{}` in its label the matched name (GRPO's rewards/NAME/mean, one per reward function). A matched name
    that is another metric's label (a reward function called `reward`, beside the total) is labelled by its key."""
    out = []
    taken = {m.label for m in row.metrics if "*" not in m.key}
    for m in row.metrics:
        if "*" not in m.key:
            out += [(m.key, m.label)] if m.key in logged else []
            continue
        head, _, tail = m.key.partition("*")
        found = (k for k in logged if k.startswith(head) and k.endswith(tail) and len(k) > len(head) + len(tail))
        labels = ((k, m.label.format(k[len(head) : len(k) - len(tail)])) for k in sorted(found))
        out += [(k, k if label in taken else label) for k, label in labels]
    return out


@cache
def table() -> dict[str, Any]:
    text = resources.files("fsdp_tune.config").joinpath("training_fields.json").read_text()
    return json.loads(text)


@cache
def fields_of(method: str = SFT) -> dict[str, dict[str, Any]]:
    """The method's config fields: name -> {"kind", "default", "choices"?}."""
    sft = table()["fields"]
    if method == SFT or method not in ROWS:
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
