"""A generating method's generation on the FSDP2 policy, as the rank spec's GenerationSpec.weights says (the launcher:
planner/generating.py generation_weights):

"sharded" (today's path): transformers' generate() on the sharded model; each forward's pre-forward hook all-gathers
every unit again and its post-forward frees it, so a completion of N tokens gathers the whole model N + 1 times.

"gathered": the whole model gathered once per generation phase with FSDP2's own FSDPModule.unshard() and given back
with reshard() after it. Read in torch 2.13 (torch/distributed/fsdp/_fully_shard/): FSDPParamGroup.unshard returns
at once when the group `is_unsharded`, so the pre-forward hooks inside the phase gather nothing; post_forward's
reshard() returns without freeing while the group is in its forward and `_reshard_after_forward` is off (its
post_forward_mesh_info None), which set_reshard_after_forward(False) makes so for every unit. The units' own
settings (post_forward_mesh_info, the state's _auto_reshard_after_forward) are put back as they were after the
phase, and reshard() then frees the gathered weights (the group's state is IDLE again after each post-forward, so
reshard() goes to _to_sharded). The root's lazy init, which the first forward would make, is made first (FSDPState
_lazy_init, idempotent): GRPO generates before the first training forward, and the root's settings (it keeps its
weights after forward) come from it. The unshard follows the units' MixedPrecisionPolicy like any forward's
all-gather: the base in its stored dtype (a 4-bit base's packed storage stays 4-bit), the LoRA weights gathered
beside it and applied by PEFT's layers as in training (nothing merged). Generation runs under no_grad, so the
pre-forward registers no post-backward hooks. Completions are those of the sharded path: the same weights, the same
forward (tests/dist/test_grpo_generation.py compares greedy decoding on 2 ranks). On CUDA the all-gathers are the
same collectives, issued once (by reading: not run on a GPU here).

On the sharded path the ranks keep stepping together until all finish (GenerationSpec.synced: transformers'
synced_gpus): every forward all-gathers, and a rank that stopped would leave the others in a collective. Gathered,
no forward inside the phase calls a collective (the units are unsharded: their pre-forward gathers nothing), so each
rank stops when its own completions end (GenerationSpec.synced off, decided with the weights: preflight/memory.py
plan_generation, an input of decide()); the next collective is after the phase, issued in the same order on every
rank. The time each generation took is kept for the step's split (GenerationClock).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator

from fsdp_tune.worker.wrappers import base


def fsdp_modules(model) -> list:
    """Every FSDP2 unit in the model, the root first (module order); a grouped unit (accelerate's
    fully_shard([norm, lm_head])) once, by its first module: its modules share one state."""
    from torch.distributed.fsdp import FSDPModule

    units, states = [], set()
    for m in model.modules():
        if isinstance(m, FSDPModule) and id(m._get_fsdp_state()) not in states:
            states.add(id(m._get_fsdp_state()))
            units.append(m)
    return units


@contextlib.contextmanager
def gathered(model) -> Iterator[list]:
    """The model's FSDP2 units all-gathered once for the block, kept gathered through its forwards, resharded after.
    Yields the units (none: a model without FSDP2 units, nothing to gather)."""
    units = fsdp_modules(model)
    if not units:
        yield units
        return
    units[0]._get_fsdp_state()._lazy_init()  # the root's, as its first forward would (no-op once made)
    kept = [_reshard_settings(u) for u in units]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    handles = [unit.unshard(async_op=True) for unit in units]  # issued together, waited on before the forwards
    try:
        for handle in handles:
            if handle is not None:
                handle.wait()
        yield units
    finally:
        for unit, settings in zip(units, kept, strict=True):
            _restore(unit, settings)
            unit.reshard()


def _reshard_settings(unit) -> tuple:
    state = unit._get_fsdp_state()
    return state._auto_reshard_after_forward, [g.post_forward_mesh_info for g in state._fsdp_param_groups]


def _restore(unit, settings: tuple) -> None:
    state = unit._get_fsdp_state()
    state._auto_reshard_after_forward, infos = settings
    for group, info in zip(state._fsdp_param_groups, infos, strict=True):
        group.post_forward_mesh_info = info


class GenerationClock:
    """Seconds and completion tokens of this rank's generations since the last read (the step's time split)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def take(self) -> float:
        seconds, self.seconds, self.calls = self.seconds, 0.0, 0
        return seconds


def install(model, weights: str, synced: bool, clock: GenerationClock | None = None) -> None:
    """The transformers model's generate() (which PEFT's generate() calls): synced_gpus as the spec says (True when
    the ranks must step together; False said explicitly, or transformers would turn it on by itself for an FSDP
    model), inside `gathered(model)` when the spec gathers the weights once, timed on `clock`."""
    target = base(model)  # under PeftModel (FSDP2's fully_shard keeps the module object: set once, kept)
    original = target.generate
    if getattr(original, "fsdp_tune_generation", False):
        return
    if weights not in ("sharded", "gathered"):
        raise ValueError(f"generation weights {weights!r}: the launcher decides sharded or gathered")

    @functools.wraps(original)
    def generate(*args, **kwargs):
        kwargs["synced_gpus"] = synced
        started = time.perf_counter()
        with gathered(model) if weights == "gathered" else contextlib.nullcontext() as units:
            if units is not None and not getattr(generate, "said", False):  # the rank log: the path taken
                print(f"fsdp-tune: generation gathers {len(units)} FSDP units once per generation", flush=True)
                generate.said = True
            out = original(*args, **kwargs)
        if clock is not None:
            clock.seconds += time.perf_counter() - started
            clock.calls += 1
        return out

    generate.fsdp_tune_generation = True
    target.generate = generate
