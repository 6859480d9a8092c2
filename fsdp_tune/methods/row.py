"""What a training method is, as torch-free data (the MethodRow every layer reads through its traits), and the
types its traits take. Each method is an entry of this package (fsdp_tune/methods/<name>.py: its `ROW`) with its
rank hook beside the ranks (fsdp_tune/worker/methods/<name>.py: its `HOOK`); fsdp_tune/methods/__init__.py lists the
entries, one line. A method's own checks of its settings (DPO's loss parameters, KTO's batches) are its row's too
(`checks`): pure functions over plain values, which rules/method.py registers under their rule ids."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

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
class Settings:
    """The training settings a method's checks read, as plain values: `values` holds every field of the method's
    TRL config (the value set, else TRL's default for the method) and any other name set (as
    RunConfig.training.get reads them), and what the installed TRL says of them (config/methods.py reads it from
    training_fields.json, above this package, and the rules layer hands it in)."""

    values: Mapping[str, Any]
    f_divergence_losses: tuple[str, ...] = ()  # DPO's loss types that take a non-default f_divergence_type

    def get(self, name: str) -> Any:
        return self.values.get(name)

    @property
    def loss_types(self) -> tuple[str, ...]:
        """loss_type as a tuple: DPO's is a list (`--loss_type sigmoid sft`), the others' one name."""
        value = self.values.get("loss_type")
        return tuple(value) if isinstance(value, (list, tuple)) else (str(value),)


@dataclass(frozen=True)
class Refused:
    """What a method's settings check finds, as plain data: rules/method.py turns it into an error or a warning
    under its rule id, citing the key as the user wrote it and where it came from."""

    rule: str  # the rule id the rules layer registers it under (FT111), listed by `fsdp-tune rules`
    severity: Literal["error", "warning"]
    key: str  # the setting's path: "training.loss_type"
    message: str
    hint: str = ""


# a method's own check of its settings: pure, no import above this package (tests/unit/test_layout.py)
SettingsCheck = Callable[[Settings], Iterable[Refused]]


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
    # a generating method whose trainer copies a PEFT model's adapter into a "ref" adapter whatever its beta
    # (RLOOTrainer; GRPOTrainer only with beta > 0): the sharded path then makes that adapter before sharding, as
    # DPO's (worker/loading/reference.py), and its reference is that frozen copy, never the adapter switched off
    copies_reference: bool = False
    named: bool = True  # the plan, the run's lines and the runs table name it (False: the default method, SFT)
    # its loss is a sum over tokens, which context parallelism's per-rank slices of every sequence add up to (SFT);
    # a loss per whole sequence (preference, a score head) or built after generating is not (FT048, FT138)
    context_parallel: bool = False
    # trained under expert parallelism (transformers' DistributedConfig; the Trainer's own loss, nothing generated or
    # compared with a reference): run on CPU ranks by tests/dist/test_expert_parallel.py (FT141 refuses the others)
    expert_parallel: bool = False
    # its own checks of its settings (DPO's loss types and their parameters, FT111; KTO's KL estimate, FT113): each
    # Refused becomes a finding under its rule id (rules/method.py ROW_RULES)
    checks: tuple[SettingsCheck, ...] = ()
    short: str = ""  # the name findings and lines say it by ("GRPO"); the name in capitals when empty

    @property
    def says(self) -> str:
        """The name findings and lines say the method by."""
        return self.short or self.name.upper()

    @property
    def preference(self) -> bool:
        """It trains on preference data (pairs, or unpaired rows), not SFT rows."""
        return self.data in ("pairs", "unpaired")

    @property
    def generates(self) -> bool:
        """It generates its completions from prompts and scores them with rewards (online RL: GRPO, RLOO): the
        generation, the rewards, the reference as the adapter off and the generation under FSDP2 are shared by every
        such method (decide/spec.py GenerationSpec, worker/training/generating.py), read by this trait."""
        return self.data == "prompts"


# what DPO and KTO log of their implicit rewards (the margin, the chosen and the rejected answer's)
PREFERENCE_REWARDS = (
    Metric("rewards/margins", "reward margin"),
    Metric("rewards/chosen", "chosen reward"),
    Metric("rewards/rejected", "rejected reward"),
)


# what every generating method's trainer logs (TRL 1.16's GRPOTrainer and RLOOTrainer alike), and each reward
# function's own mean: a `*` row stands for every name TRL logs there (metric_keys); the step's time split is
# worker/training/generating.py's (TRL's step_time holds generation and scoring)
GENERATING_METRICS = (
    Metric("reward", "reward"),
    Metric("completions/mean_length", "completion length", ".1f"),
    Metric("kl", "KL", ".4f"),
    Metric("rewards/*/mean", "{}"),
    Metric("reward_std", "reward std"),
    Metric("timing/generation_s", "generation s", ".2f"),
    Metric("timing/scoring_s", "scoring s", ".2f"),
    Metric("step_time", "step s", ".2f"),
)
GENERATING_PROGRESS = (
    Metric("reward", "reward"),
    Metric("completions/mean_length", "length", ".1f"),
    Metric("kl", "kl", ".4f"),
)
GENERATING_EVAL = (Metric("eval_reward", "reward"), Metric("eval_completions/mean_length", "length", ".1f"))
# its no-grad log-prob passes and the generation depend on its config, not on the method (planner/generating.py)
GENERATING_STEP = Step(
    describe="completions generated on the ranks, then trained on as SFT rows (planner/generating.py: the generation "
    "and the log-prob passes before it)",
)
