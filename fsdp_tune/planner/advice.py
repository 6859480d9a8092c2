"""What would make a run fit: combinations of changes planned one by one, the cheapest that fits first, each as the
complete flags to add to the command.

Axes, each tried as it is and changed: the micro-batch (every divisor down to 1, gradient accumulation raised to keep
the global batch), activation checkpointing, CPU offload, sharded loading (a 4-bit run on the transformers path),
more GPUs (x2, x4: accumulation lowered to keep the global batch where it divides), and two that change what is
trained: QLoRA (4-bit base weights) and half the sequence length. Every combination of the other axes is planned
with the largest micro-batch that fits (a smaller one only adds all-gathers); an estimate costs well under a
millisecond, so the search (at most a few hundred variants, `advice_searched`) stays far below the meta model's
build. Ranked: the same training on the same GPUs first, then more GPUs, then changes to what is trained; within
each by the planner's GPU-seconds per token (steptime.py), then fewer changes; and those that leave the allocator
room before all those at the card's capacity. An option is dropped when a subset of its changes fits as well and is
no slower, or asks less (a lower tier).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import cp_degree, gradient_checkpointing, model_of
from fsdp_tune.decide.loading import why_not_sharded
from fsdp_tune.decide.method import steps
from fsdp_tune.planner.allocator import device_memory
from fsdp_tune.planner.memory import GiB, estimate
from fsdp_tune.planner.shape import ModelShape
from fsdp_tune.planner.stack import Stack
from fsdp_tune.planner.steptime import Gpu, step_time

SHOWN = 5  # options listed
SAME, MORE_GPUS, OTHER_TRAINING = 0, 1, 2  # the tiers, in the order they are listed


@dataclass(frozen=True)
class Change:
    axis: str
    tier: int
    apply: Callable[[RunConfig], RunConfig]
    note: str = ""  # said beside the option: what else it changes


@dataclass(frozen=True)
class Target:
    """What a variant is planned against: the card's memory and, when the plan is for this machine, its RAM."""

    shape: ModelShape
    gpu: Gpu
    budget_gib: float
    host_gib: float | None
    stack: Stack | None
    loading: str


def micro(cfg: RunConfig) -> int:
    return steps(cfg).per_device_train_batch_size


def accum(cfg: RunConfig) -> int:
    return steps(cfg).gradient_accumulation_steps


def _with_args(cfg: RunConfig, **args) -> RunConfig:
    return replace(cfg, training=replace(cfg.training, args=dict(cfg.training.args, **args)))


def _micro_axis(cfg: RunConfig) -> list[Change | None]:
    """Every smaller micro-batch that divides it, largest first, accumulation raised to keep the global batch."""
    m = micro(cfg)
    out: list[Change | None] = [None]
    for k in sorted((d for d in range(1, m) if m % d == 0), reverse=True):
        out.append(
            Change(
                "micro-batch",
                SAME,
                lambda c, k=k: _with_args(
                    c, per_device_train_batch_size=k, gradient_accumulation_steps=accum(c) * micro(c) // k
                ),
            )
        )
    return out


def sharded_change(cfg: RunConfig, loading: str, shape: ModelShape | None) -> Change | None:
    """The change that makes a 4-bit run on the transformers path (the whole 4-bit model on each GPU while it
    loads) load sharded, where one exists: FSDP2 for an FSDP1 config, and sharded loading itself."""
    if loading != "transformers" or not cfg.quantization.use_4bit_quantization:
        return None

    def apply(c: RunConfig) -> RunConfig:
        loading = "sharded" if c.model.loading == "transformers" else c.model.loading
        return replace(c, fsdp=replace(c.fsdp, version=2), model=replace(c.model, loading=loading))

    facts = shape.facts if shape is not None else model_of(cfg)  # the shape's: the model's facts as decided
    return Change("sharded loading", SAME, apply) if why_not_sharded(apply(cfg), facts) is None else None


def _more_gpus(k: int) -> Change:
    def apply(c: RunConfig) -> RunConfig:
        lc = c.launch
        per_node = min(lc.nproc_per_node * k, max(lc.nproc_per_node, 8))
        launch = replace(lc, num_processes=lc.num_processes * k, num_machines=lc.num_processes * k // per_node)
        c = replace(c, launch=launch)
        return _with_args(c, gradient_accumulation_steps=accum(c) // k) if accum(c) % k == 0 else c

    return Change("GPUs", MORE_GPUS, apply)


LONG_SEQUENCE = 16384  # from this length on, context parallelism is an axis of the search
CP_SIZES = (2, 4, 8)


def _cp_axis(cfg: RunConfig) -> list[Change | None]:
    """Context parallelism for a long sequence (SFT only, FT048): cp_size k over the same GPUs, where k divides the
    ranks and 2k the sequence (each rank takes two chunks), gradient accumulation raised k-fold to keep the global
    batch (the data-parallel degree falls to world / k)."""
    fixed_mesh = cfg.parallelism.enabled and cfg.parallelism.dp_shard_size is not None
    taken = row_of(cfg.run.method).context_parallel
    if cfg.data.max_seq_len < LONG_SEQUENCE or cp_degree(cfg) > 1 or not taken or fixed_mesh:
        return []
    world = cfg.launch.num_processes
    out: list[Change | None] = [None]
    for k in CP_SIZES:
        if world % k or cfg.data.max_seq_len % (2 * k):
            continue

        def apply(c: RunConfig, k: int = k) -> RunConfig:
            c = replace(c, parallelism=replace(c.parallelism, enabled=True, cp_size=k))
            return _with_args(c, gradient_accumulation_steps=accum(c) * k)

        out.append(
            Change(
                "context parallelism", SAME, apply, f"each rank holds 1/{k} of every sequence; SDPA attention (FT048)"
            )
        )
    return out if len(out) > 1 else []


def axes(cfg: RunConfig, loading: str, shape: ModelShape | None = None) -> list[list[Change | None]]:
    """Each axis: None (as it is) and its changes; long lists are the micro-batch's divisors."""
    out = [_micro_axis(cfg)]
    if not cfg.fsdp.activation_checkpointing and not gradient_checkpointing(cfg):
        if row_of(cfg.run.method).recompute_with_fsdp:  # the Trainer's would be refused (FT116): FSDP's recomputes
            recompute = lambda c: replace(c, fsdp=replace(c.fsdp, activation_checkpointing=True))  # noqa: E731
        else:
            recompute = lambda c: _with_args(c, gradient_checkpointing=True)  # noqa: E731
        out.append([None, Change("checkpointing", SAME, recompute)])
    if not cfg.fsdp.cpu_offload:
        out.append([None, Change("offload", SAME, lambda c: replace(c, fsdp=replace(c.fsdp, cpu_offload=True)))])
    sharded = sharded_change(cfg, loading, shape)
    if sharded:
        out.append([None, sharded])
    if not cfg.parallelism.enabled:
        out.append([None, _more_gpus(2), _more_gpus(4)])
    cp = _cp_axis(cfg)
    if cp:
        out.append(cp)
    q = cfg.quantization
    if cfg.lora.use_peft_lora and not q.use_4bit_quantization and not q.use_8bit_quantization:
        four_bit = replace(
            q,
            use_4bit_quantization=True,
            use_nested_quant=True,
            bnb_4bit_compute_dtype="bfloat16",
            bnb_4bit_quant_storage_dtype="bfloat16",
        )
        out.append([None, Change("QLoRA", OTHER_TRAINING, lambda c: replace(c, quantization=four_bit), "4-bit base")])
    if cfg.data.max_seq_len >= 512:
        half = cfg.data.max_seq_len // 2
        cut = Change(
            "sequence length",
            OTHER_TRAINING,
            lambda c: replace(c, data=replace(c.data, max_seq_len=half)),
            f"rows cut at {half} tokens",
        )
        out.append([None, cut])
    return out


# (flag, how a config says it): the flags an option lists are every one whose value its variant changed
_FLAGS: tuple[tuple[str, Callable[[RunConfig], object]], ...] = (
    ("--per_device_train_batch_size", micro),
    ("--gradient_accumulation_steps", accum),
    ("--gradient_checkpointing", lambda c: bool(c.training.get("gradient_checkpointing"))),
    ("--fsdp_activation_checkpointing", lambda c: c.fsdp.activation_checkpointing),
    ("--fsdp_offload_params", lambda c: c.fsdp.cpu_offload),
    ("--fsdp_version", lambda c: c.fsdp.version),
    ("--loading", lambda c: c.model.loading),
    ("--num_processes", lambda c: c.launch.num_processes),
    ("--num_machines", lambda c: c.launch.num_machines),
    ("--use_4bit_quantization", lambda c: c.quantization.use_4bit_quantization),
    ("--use_nested_quant", lambda c: c.quantization.use_nested_quant),
    ("--bnb_4bit_compute_dtype", lambda c: c.quantization.bnb_4bit_compute_dtype),
    ("--bnb_4bit_quant_storage_dtype", lambda c: c.quantization.bnb_4bit_quant_storage_dtype),
    ("--max_seq_len", lambda c: c.data.max_seq_len),
    ("--use_parallelism_config", lambda c: c.parallelism.enabled),
    ("--parallelism_config_cp_size", lambda c: c.parallelism.cp_size),
)


def flags(base: RunConfig, variant: RunConfig) -> str:
    """The flags that turn `base` into `variant`, complete: pasted after the command, they make the variant."""
    out = []
    for flag, get in _FLAGS:
        value = get(variant)
        if value != get(base):
            out.append(f"{flag} {str(value).lower() if isinstance(value, bool) else value}")
    return " ".join(out)


def _planned(variant: RunConfig, path: str, target: Target) -> dict:
    est = estimate(variant, target.shape, stack=target.stack, loading=path)
    device = device_memory(est, target.budget_gib)
    host = est.host_node_bytes / GiB
    host_ok = target.host_gib is None or host <= target.host_gib
    return dict(device, fits=device["fits"] and host_ok, host_memory_gib_per_node=round(host, 2))


def _global_batch(c: RunConfig) -> int:
    return micro(c) * accum(c) * c.launch.num_processes // cp_degree(c)  # CP ranks share a sequence


def _option(cfg: RunConfig, changes: list[Change], variant: RunConfig, planned: dict, target: Target) -> dict:
    st = step_time(variant, target.shape, target.gpu)
    notes = [c.note for c in changes if c.note]
    if _global_batch(variant) != _global_batch(cfg):
        notes.append(f"global batch {_global_batch(variant)}, was {_global_batch(cfg)}")
    return {
        "flags": flags(cfg, variant),
        "change": ", ".join(c.axis for c in changes),
        "axes": sorted(c.axis for c in changes),
        "tier": max(c.tier for c in changes),
        "per_gpu_memory_gib": planned["per_gpu_memory_gib"],
        "range_gib": planned["range_gib"],
        "at_capacity": planned["at_capacity"],
        "host_memory_gib_per_node": planned["host_memory_gib_per_node"],
        "step_s": round(st["step_s"], 3),
        "gpu_s_per_token": st["step_s"] / st["tokens_per_step_per_gpu"] if st["tokens_per_step_per_gpu"] else 0.0,
        "note": "; ".join(notes),
    }


def search(cfg: RunConfig, target: Target, need_room: bool) -> tuple[list[dict], int]:
    """(the options that fit, cheapest first, at most SHOWN; how many variants were planned). `need_room`: the
    run fits at the card's capacity, so only options that leave the allocator room are worth listing."""
    micro_axis, *rest = axes(cfg, target.loading, target.shape)
    options, searched = [], 0
    for combo in itertools.product(*rest):
        found = None
        for m in micro_axis:  # largest micro-batch first: the first with room ends the search
            changes = [c for c in (m, *combo) if c]
            if not changes:
                continue
            variant = cfg
            for change in changes:
                variant = change.apply(variant)
            path = "sharded" if any(c.axis == "sharded loading" for c in changes) else target.loading
            planned = _planned(variant, path, target)
            searched += 1
            if planned["fits"] and (found is None or not planned["at_capacity"]):
                found = (changes, variant, planned)
            if planned["fits"] and not planned["at_capacity"]:
                break
        if found and not (need_room and found[2]["at_capacity"]):
            options.append(_option(cfg, *found, target))
    return _ranked(options)[:SHOWN], searched


def _ranked(options: list[dict]) -> list[dict]:
    def dominated(b: dict) -> bool:  # some of its changes fit as well without the others: no slower, or asking less
        return any(
            set(a["axes"]) < set(b["axes"])
            and a["at_capacity"] <= b["at_capacity"]
            and (a["gpu_s_per_token"] <= b["gpu_s_per_token"] * 1.001 or a["tier"] < b["tier"])
            for a in options
        )

    kept = [o for o in options if not dominated(o)]
    return sorted(
        kept, key=lambda o: (o["at_capacity"], o["tier"], float(f"{o['gpu_s_per_token']:.3g}"), len(o["axes"]))
    )
