"""The training method's part of the rank spec: its row's traits (MethodSpec), the batch and checkpoint schedule
its config will read (Steps), and a generating method's rewards, generation and reference (GenerationSpec). The
arguments its TRL config takes are decide/trainer.py's. Pure, like rank.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.spec import GenerationSpec, MethodSpec, Steps


def method_spec(cfg: RunConfig) -> MethodSpec:
    """The method's row, as the ranks execute it (config/methods.py)."""
    row = row_of(cfg.run.method)
    return MethodSpec(
        name=row.name,
        data=row.data,
        head=row.head,
        # a generating method's reference with a starting adapter (beta > 0, --reference adapter) is DPO's frozen
        # "ref" copy; so is the reference of a trainer that makes that copy whatever its beta (copies_reference)
        reference_adapter=row.reference or row.copies_reference or _reference(cfg) == "ref_adapter",
        truncation=row.truncation,
    )


def _reference(cfg: RunConfig) -> str:
    """What a generating method's KL term compares with: nothing (beta 0), a frozen copy of the starting adapter,
    or the same sharded model with the adapter switched off (the base, a fresh adapter's start); a trainer that
    copies the adapter whatever its beta compares with that copy (the row's copies_reference)."""
    row = row_of(cfg.run.method)
    if not row.generates or not float(cfg.training.get("beta") or 0):
        return "off"
    started = cfg.model.adapter and cfg.model.reference == "adapter"
    return "ref_adapter" if started or row.copies_reference else "adapter_disabled"


@dataclass(frozen=True)
class GenerationWeights:
    """How transformers' generate() meets FSDP2's shards, as the memory plan decided it on the GPUs the ranks use
    (preflight/memory.py plan_generation, planner/generating.py generation_weights): an input of decide(), made before
    the rank spec is, so that no field of it is written after decide()."""

    weights: Literal["sharded", "gathered"]
    why: str  # the decision in words, with the memory that decided it


def generation_spec(cfg: RunConfig, world_size: int, planned: GenerationWeights | None = None) -> GenerationSpec | None:
    """A generating method's rewards as resolved (the rules refused what does not resolve: FT131), how it
    generates and what its KL term compares with (_reference). `planned`: the generation weights the launcher's
    memory plan decided (--grpo_generation auto settled); without it the weights are as asked ("auto" unsettled:
    `plan` and the trace, which decide nothing for the ranks). The ranks step together while they generate on the
    sharded path only: gathered, no forward inside the phase calls a collective (worker/training/generation.py)."""
    if not row_of(cfg.run.method).generates:
        return None
    from fsdp_tune.rewards.resolve import Unresolved, resolve

    rewards = []
    for entry in cfg.run.reward_funcs:
        try:
            rewards.append(resolve(entry))
        except Unresolved:
            continue
    vllm = bool(cfg.training.get("use_vllm"))
    completion = int(cfg.training.get("max_completion_length") or 0)
    weights = cfg.run.grpo_generation if not vllm else "sharded"  # "auto": settled by the launcher's memory plan
    why = "asked: --grpo_generation" if cfg.run.grpo_generation != "auto" else ""
    if planned is not None and not vllm:
        weights, why = planned.weights, planned.why
    return GenerationSpec(
        rewards=tuple(rewards),
        generation="vllm" if vllm else "transformers",
        synced=world_size > 1 and weights != "gathered",
        weights=weights,
        weights_why=why,
        weight_sync="adapter" if vllm else None,
        reference=_reference(cfg),
        max_prompt_tokens=cfg.data.max_seq_len - completion if completion else None,
        num_generations=cfg.training.get("num_generations"),
        max_completion_length=cfg.training.get("max_completion_length"),
    )


def steps_per_generation(cfg: RunConfig) -> int:
    """Micro-steps one generation's completions are split over: steps_per_generation, else (GRPOConfig's default)
    gradient_accumulation_steps."""
    t = cfg.training
    unset = t.get("steps_per_generation") is None
    return steps(cfg).gradient_accumulation_steps if unset else int(t.get("steps_per_generation"))


def generation_batch(cfg: RunConfig) -> tuple[int, int, str]:
    """(the completions each generation makes, the global batch, how the first is made), as
    GRPOConfig.__post_init__ computes them from the settings TrainingSettings.get gives (its defaults unset)."""
    t = cfg.training
    world = max(cfg.launch.num_processes, 1)
    per_device = steps(cfg).per_device_train_batch_size
    if t.get("generation_batch_size") is not None:
        return int(t.get("generation_batch_size")), per_device * world, "generation_batch_size"
    per_generation = steps_per_generation(cfg)
    words = f"per_device_train_batch_size {per_device} x {world} ranks x {per_generation} steps a generation"
    return per_device * world * per_generation, per_device * world, words


def steps(cfg: RunConfig) -> Steps:
    """The batch, the end and the checkpoint schedule as the method's config will read them: the run's settings,
    else that config's defaults (TrainingSettings.get: training_fields.json, read from the installed TRL)."""
    value = cfg.training.get
    return Steps(
        per_device_train_batch_size=int(value("per_device_train_batch_size")),
        gradient_accumulation_steps=int(value("gradient_accumulation_steps")),
        max_steps=int(value("max_steps")),
        max_grad_norm=float(value("max_grad_norm") or 0.0),
        optim=str(value("optim")),
        save_strategy=value("save_strategy"),
        save_steps=float(value("save_steps")),
        save_total_limit=value("save_total_limit"),
    )
