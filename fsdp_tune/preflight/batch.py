"""Pre-flight warnings about the global batch: a resume that changes it, and data smaller than one step.

Global batch = world_size x per_device_train_batch_size x gradient_accumulation_steps. A resume on another
number of ranks continues the learning-rate schedule at the same step with another batch (2 -> 1 ranks halves
it), and the Trainer skips the batches already trained counted in the new size. That is warned, with the
numbers and the gradient accumulation that keeps the batch, not refused: continuing on fewer machines after
losing one is what a checkpoint is for.

Fewer training rows than one step takes (world_size x per-device batch): by reading accelerate's
BatchSamplerShard (even_batches, the Trainer's default), each rank's batch is filled by cycling the rows there
are, so every step trains on the same rows repeated (1 row on 2 ranks x 4: that row 8 times a step).
"""

from __future__ import annotations

from pathlib import Path

from fsdp_tune.decide.datafiles import Counted
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.rundir.checkpoints import trained_batch


def _ours(spec: RankSpec) -> tuple[int, int, int]:
    s = spec.steps
    return spec.world.world_size, s.per_device_train_batch_size, s.gradient_accumulation_steps


def resume_batch(checkpoint: str | None, spec: RankSpec) -> list[Finding]:
    """PF063: resuming `checkpoint` with another global batch than it was trained with."""
    then = trained_batch(checkpoint) if checkpoint else None
    if then is None:
        return []
    world, per_device, accumulation = _ours(spec)
    old_accumulation = then["gradient_accumulation_steps"] or accumulation  # unknown: assumed unchanged
    old = then["world_size"] * then["per_device_train_batch_size"] * old_accumulation
    new = world * per_device * accumulation
    if old == new:
        return []
    keep, rest = divmod(old, world * per_device)
    hint = (
        f"--gradient_accumulation_steps {keep} keeps a global batch of {old}"
        if keep and not rest
        else f"no gradient accumulation gives {old} on {world} rank(s) x {per_device}: choose ranks and batch that do"
    )
    assumed = "" if then["gradient_accumulation_steps"] else " (accumulation not recorded: assumed unchanged)"
    return [
        Finding(
            "PF063",
            Severity.WARNING,
            "--resume_from_checkpoint",
            "command line",
            f"{Path(checkpoint or '').name} was trained with a global batch of {old} ({_terms(then, old_accumulation)})"
            f"{assumed}; this run has {new} ({world} rank(s) x {per_device} per device x {accumulation} accumulation "
            "step(s)): the learning-rate schedule continues at the same step with another batch",
            hint,
        )
    ]


def _terms(then: dict, accumulation: int) -> str:
    return (
        f"{then['world_size']} rank(s) x {then['per_device_train_batch_size']} per device x {accumulation} "
        "accumulation step(s)"
    )


def rows_for_one_step(spec: RankSpec, counted: tuple[Counted, ...]) -> list[Finding]:
    """PF064: fewer training rows than one step takes, counted by the pre-flight (local files read whole;
    `counted`: check_data's, beside the spec)."""
    pairs = zip(spec.data.sources, counted, strict=True)
    counts = [s.samples if s.samples is not None else c.rows_checked for s, c in pairs]
    if not counts or any(c is None for c in counts):
        return []
    rows = int(sum(counts) * (1 - (spec.data.test_split_size or 0)))
    world, per_device, _ = _ours(spec)
    if rows >= world * per_device or not sum(counts):  # none at all: refused as such (PF017, PF070)
        return []
    return [
        Finding(
            "PF064",
            Severity.WARNING,
            "--per_device_train_batch_size",
            spec.data.sources[0].path if len(spec.data.sources) == 1 else "the datasets",
            f"{rows} training row(s) for {world} rank(s) x {per_device} per device ({world * per_device} a step): "
            "every rank's batch is filled by cycling the rows there are, so every step trains on the same rows "
            "repeated",
            "add rows, or a smaller --per_device_train_batch_size / fewer --num_processes",
        )
    ]
