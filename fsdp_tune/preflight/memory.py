"""train's memory pre-flight on a GPU machine: the run planned on the GPUs it will use, refused when its peak does
not fit the smallest of them (PF050), naming the phase, the figures and the cheapest change that fits.

The GPUs' memory is read without torch (nvidia-smi, decide/machine.py); the plan is the same `fsdp-tune plan`
prints, on the loading path the rank spec takes. `--skip_memory_check` launches anyway (the planner is a model,
not a measurement: BENCHMARKS.md section 6 says how close it has been).
"""

from __future__ import annotations

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.method import GenerationWeights
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.errors import Finding, Severity, UsageError

# nvidia-smi's name -> the planner's GPU (its TFLOP/s and links; the memory is the card's own)
_GPU_KEYS = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("4090", "4090"))


def gpu_key(name: str) -> str:
    return next((key for part, key in _GPU_KEYS if part in name), "h100")


def planned_gpu(cards: list[tuple[str, int]]) -> tuple[str, str]:
    """(the planner's GPU, its memory) for the smallest of (name, MiB) cards: what a run's memory is planned on."""
    name, mib = min(cards, key=lambda g: g[1])
    return gpu_key(name), f"{mib}MiB"


def ranks_gpus(spec: RankSpec, machine: Machine) -> list[tuple[str, int]]:
    """(name, MiB) of the GPUs this machine's ranks will use: CUDA_VISIBLE_DEVICES (or gpu_ids) by index when it
    names indices, else every GPU of the host."""
    gpus = list(zip(machine.gpu_names, machine.gpu_memory_mib, strict=False))
    visible = spec.env.get("CUDA_VISIBLE_DEVICES", machine.cuda_visible_devices)
    if visible:
        wanted = [d.strip() for d in visible.split(",") if d.strip()]
        if all(d.isdigit() and int(d) < len(gpus) for d in wanted):
            gpus = [gpus[int(d)] for d in wanted]
    return gpus[: spec.world.nproc_per_node] if spec.world.nproc_per_node <= len(gpus) else gpus


def check_memory(
    cfg: RunConfig, spec: RankSpec, machine: Machine, image_size: tuple[int, int] | None = None
) -> list[Finding]:
    """PF050 when the plan's peak does not fit the smallest GPU the ranks use; a note when it cannot be planned.
    `image_size`: the largest image the data pre-flight found (preflight/vision.py largest)."""
    if spec.device != "cuda" or cfg.run.skip_memory_check:
        return []
    gpus = ranks_gpus(spec, machine)
    if not gpus:
        return []
    name, mib = min(gpus, key=lambda g: g[1])
    from fsdp_tune.planner.plan import memory_plan

    try:
        plan = memory_plan(
            cfg, *planned_gpu(gpus), loading=spec.loading.path, image_size=image_size, model=spec.model.facts
        )
    except UsageError as err:
        return [Finding("PF050", Severity.NOTE, "--model_name_or_path", "this machine", f"memory not checked: {err}")]
    card = f"{mib / 1024:.1f} GiB {name}" + (f" (the smallest of {len(gpus)} GPUs here)" if len(gpus) > 1 else "")
    if plan["fits"] and not plan["at_capacity"]:
        return []
    low, high = plan["range_gib"]
    advice = plan["advice"]
    first = ""
    if advice:
        first = f"{advice[0]['flags']} (plans {advice[0]['range_gib'][0]}-{advice[0]['range_gib'][1]} GiB)"
    if plan["fits"]:
        return [
            Finding(
                "PF050",
                Severity.WARNING,
                "memory",
                "this machine",
                f"at the card's capacity: the plan needs {low:.1f}-{high:.1f} GiB per GPU at {plan['peak_phase']} "
                f"on a {card}; the allocator's cache may not leave room",
                (f"{first} would leave room; " if first else "")
                + "`fsdp-tune plan` shows where the memory goes and what would leave room",
            )
        ]
    fix = first or "nothing fsdp-tune tried fits"
    return [
        Finding(
            "PF050",
            Severity.ERROR,
            "memory",
            "this machine",
            f"the plan needs at least {low:.1f} GiB per GPU at {plan['peak_phase']} ({plan['peak_allocated_gib']} GiB "
            f"allocated + CUDA context) on a {card}: the run would stop out of memory",
            f"{fix}; `fsdp-tune plan` shows where the memory goes; --skip_memory_check launches anyway",
        )
    ]


def plan_generation(cfg: RunConfig, machine: Machine) -> GenerationWeights | None:
    """A generating method's generation weights (--grpo_generation auto: gathered once per generation where the
    plan finds room, else sharded), decided on the GPUs the ranks use by the plan `fsdp-tune plan` prints
    (planner/generating.py generation_weights): an input of decide() (decide/method.py GenerationWeights), so the rank
    spec is made once with it. The plan is made on where a first decision puts the ranks (their device, the GPUs
    they see, their loading path): decide() is pure, and that draft is dropped. None: nothing to plan (not a
    generating method, or vLLM generates)."""
    from fsdp_tune.decide.rank import decide

    draft = decide(cfg, machine)
    g = draft.generating
    if g is None or g.generation == "vllm":
        return None
    gpus = ranks_gpus(draft, machine) if draft.device == "cuda" else []
    gpu, memory = planned_gpu(gpus) if gpus else ("h100", None)
    from fsdp_tune.planner.plan import generation_plan

    try:
        decided = generation_plan(cfg, gpu, memory, on_cpu=draft.device == "cpu", loading=draft.loading.path)
        return GenerationWeights(decided["weights"], decided["why"])
    except UsageError as err:  # a model the planner cannot measure: what was asked, else today's path
        weights = g.weights if g.weights != "auto" else "sharded"
        return GenerationWeights(weights, f"memory not planned ({err}): {weights}")
