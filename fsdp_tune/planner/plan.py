"""`fsdp-tune plan`: will it fit, where does the memory go, how long is a step, and what would make it fit."""

from __future__ import annotations

from fsdp_tune.config.fsdp2 import version_note
from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import model_of
from fsdp_tune.decide.gpus import GPUS
from fsdp_tune.decide.loading import loading_path
from fsdp_tune.decide.trl_defaults import defaults_note
from fsdp_tune.errors import UsageError
from fsdp_tune.planner.advice import Target, search
from fsdp_tune.planner.allocator import CUDA_CONTEXT_GIB, assumptions, device_memory
from fsdp_tune.planner.experts import expert_parallel
from fsdp_tune.planner.generating import generation_weights
from fsdp_tune.planner.memory import LOADINGS, GiB, estimate
from fsdp_tune.planner.shape import measure
from fsdp_tune.planner.stack import Stack, stack_of
from fsdp_tune.planner.steptime import parse_memory, step_time
from fsdp_tune.planner.vision import describe, image_load
from fsdp_tune.sources.model import ModelFacts, not_found

EP_NOTE = (
    "expert parallelism: the memory and all-gather terms are FSDP2's over every rank, experts included, and the "
    "loading phase has every rank read the whole checkpoint; transformers' DistributedConfig gathers no expert "
    "held whole on its rank and reads each rank's shard only: over-estimates (not measured under ep_size)"
)
_CTX = CUDA_CONTEXT_GIB[1]  # the CUDA context's upper bound, beside the gathered model (planner/generating.py)


def _check(cfg: RunConfig, facts: ModelFacts, gpu_key: str, loading: str) -> str:
    """The model name to plan, or a UsageError that says what to pass."""
    name = cfg.model.model_name_or_path
    if not name:
        raise UsageError(
            "plan needs --model_name_or_path (a local folder, a config.json, or a known hub id)",
            "e.g. --model_name_or_path meta-llama/Llama-2-70b-hf (reference configs: fsdp_tune/sources/reference)",
        )
    if facts.config is None:  # as the model door found it: a folder, the cache, a reference config
        raise UsageError(*not_found(name, facts))
    if gpu_key not in GPUS:
        raise UsageError(f"--gpu {gpu_key}: unknown", f"one of: {', '.join(GPUS)}")
    if loading not in LOADINGS:
        raise UsageError(f"--loading {loading}: unknown", f"one of: {', '.join(LOADINGS)}")
    return name


def memory_plan(
    cfg: RunConfig,
    gpu_key: str = "h100",
    gpu_memory: str | None = None,
    on_cpu: bool = False,
    loading: str | None = None,
    stack: Stack | None = None,
    host_gib: float | None = None,
    image_size: tuple[int, int] | None = None,
    model: ModelFacts | None = None,
) -> dict:
    """The plan `fsdp-tune plan` prints. `stack` replaces fsdp-tune's own code path (benchmarks/ uses it to
    plan a published run as it was made); `loading` is how the weights reach the ranks (LOADINGS): by default
    the path the run takes (decide/loading.py, as the rank spec decides it); `host_gib`: the RAM of the machine
    the plan is for, when it is this one (host_fits judges the node's peak against it; None: not judged); `model`:
    the model's facts as the rank spec decided them (ModelSpec.facts), else found once here as decide finds them.
    It is long because it is the plan's one result, field by field."""
    facts = model if model is not None else model_of(cfg)
    loading, note = (loading, None) if loading else loading_path(cfg, facts)
    name = _check(cfg, facts, gpu_key, loading)
    gpu = GPUS[gpu_key]
    budget = parse_memory(gpu_memory) if gpu_memory else gpu.memory_gib
    shape = measure(facts, name)
    est = estimate(cfg, shape, on_cpu=on_cpu, stack=stack, loading=loading, image_size=image_size)
    st = stack or stack_of(cfg, on_cpu, shape.facts)
    result = {
        "method": cfg.run.method,
        "model": _model_entry(name, shape),
        "total_params": est.total_params,
        "trainable_params": est.trainable_params,
        "world_size": cfg.launch.num_processes,
        "device": "cpu" if on_cpu else gpu.name,
        "loading": loading,
        "loading_note": note,
        "host_memory_gib_per_node": round(est.host_node_bytes / GiB, 2),
        "host_memory_gib_per_node_steady": round(est.host_node_steady_bytes / GiB, 2),
        "components": {k: round(v / GiB, 3) for k, v in est.device.items()},
        "phases_gib": {k: round(v / GiB, 2) for k, v in est.phases.items()},
        "host_components": {k: round(v / GiB, 3) for k, v in est.host_node.items()},
        "notes": [n for n in (version_note(cfg), defaults_note(cfg)) if n] + est.notes,
        "assumptions": assumptions(st, f"{loading} ({note})" if note else loading, on_cpu),
        "step_time": None if on_cpu else step_time(cfg, shape, gpu),
        "host_ram_gib": None if host_gib is None else round(host_gib, 1),
        "host_fits": None if host_gib is None else est.host_node_bytes / GiB <= host_gib,
        "advice": [],
        "advice_searched": 0,
    }
    _experts(cfg, shape, st, result)
    _vision(cfg, shape, image_size, result)
    _generation(cfg, shape, st, est.phases, None if on_cpu else budget, result, gpu)
    if on_cpu:
        per_rank = est.cpu_rank_peak_bytes() / GiB
        result.update(per_gpu_memory_gib=None, per_rank_host_peak_gib=round(per_rank, 2), gpu_memory_gib=None)
        result.update(fits=True, range_gib=None, peak_allocated_gib=None, peak_phase=est.peak_phase)
        return result
    result.update(device_memory(est, budget))
    return _advise(cfg, result, Target(shape, gpu, budget, host_gib, stack, loading))


def _model_entry(name: str, shape) -> dict:
    """The plan's model: its name, where its config came from, its shape in brief."""
    return {
        "name": name,
        "source": shape.source,
        "layers": shape.n_layers,
        "layer_class": shape.layer_class,
        "hidden_size": shape.hidden_size,
        "vocab_size": shape.vocab_size,
        "experts": f"{shape.top_k} of {shape.n_experts} per token" if shape.n_experts else None,
    }


def generation_plan(cfg: RunConfig, gpu_key: str, gpu_memory: str | None, on_cpu: bool, loading: str) -> dict:
    """GRPO's generation weights alone (planner/generating.py generation_weights), as memory_plan decides them, without
    its step time and advice: an input of decide() (preflight/memory.py plan_generation)."""
    facts = model_of(cfg)
    name = _check(cfg, facts, gpu_key, loading)
    budget = None if on_cpu else parse_memory(gpu_memory) if gpu_memory else GPUS[gpu_key].memory_gib
    shape = measure(facts, name)
    st = stack_of(cfg, on_cpu, shape.facts)
    est = estimate(cfg, shape, on_cpu=on_cpu, stack=st, loading=loading)
    return generation_weights(cfg, shape, st, est.phases, budget, _CTX)


def _generation(cfg: RunConfig, shape, st: Stack, phases: dict, budget: float | None, result: dict, gpu) -> None:
    """GRPO: gathered once per generation, or sharded, with the memory that decided it (planner/generating.py); the step
    time then counts one all-gather of the model per generation instead of one per generated token."""
    if not row_of(cfg.run.method).generates:
        return
    result["grpo_generation"] = decided = generation_weights(cfg, shape, st, phases, budget, _CTX)
    if result["step_time"] and decided["weights"] == "gathered":
        result["step_time"] = step_time(cfg, shape, gpu, generation_once=True)


def _experts(cfg: RunConfig, shape, st: Stack, result: dict) -> None:
    """Expert parallelism: experts per rank and the all-to-all (planner/experts.py), and what the rest overstates."""
    result["expert_parallel"] = ep = expert_parallel(cfg, shape, st.compute_bytes)
    if ep:
        result["notes"].append(EP_NOTE)


def _vision(cfg: RunConfig, shape, image_size, result: dict) -> None:
    """A vision-language model's tower, and an image's patches and tokens, with the size assumed (planner/vision.py)."""
    load = image_load(shape, image_size)
    if load is None:
        return
    result["vision"] = describe(shape, load, cfg)
    said = "the data's largest image" if not load.assumed else "assumed; train's plan takes the data's largest"
    result["assumptions"].append(
        f"images: one a sequence, {load.width}x{load.height} ({said}): {load.patches} patches in the tower, "
        f"{load.tokens} tokens of max_seq_len in the language model"
    )
    if not (cfg.model.freeze_vision_tower and cfg.model.freeze_multi_modal_projector):
        result["notes"].append(
            "the trainable count and its optimizer state are the language model's LoRA; the vision tower's LoRA "
            "or a projector trained whole add to them (not counted)"
        )


def _advise(cfg: RunConfig, result: dict, target: Target) -> dict:
    """The plan with what would make it fit (planner/advice.py), searched when it does not or sits at capacity."""
    if not result["fits"] or result["at_capacity"] or result["host_fits"] is False:
        need_room = result["fits"] and result["host_fits"] is not False
        result["advice"], result["advice_searched"] = search(cfg, target, need_room)
    return result
