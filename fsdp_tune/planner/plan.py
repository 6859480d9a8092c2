"""`fsdp-tune plan`: will it fit, where does the memory go, how long is a step, and what would make it fit."""

from __future__ import annotations

from dataclasses import replace

from fsdp_tune.config.derived import gradient_checkpointing
from fsdp_tune.config.fsdp2 import version_note
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.config.trl_defaults import defaults_note
from fsdp_tune.errors import UsageError
from fsdp_tune.launch.loading import loading_path, why_not_sharded
from fsdp_tune.planner.allocator import assumptions, device_memory
from fsdp_tune.planner.memory import LOADINGS, GiB, estimate
from fsdp_tune.planner.shape import ModelShape, find_config, measure
from fsdp_tune.planner.stack import Stack, stack_of
from fsdp_tune.planner.steptime import GPUS, parse_memory, step_time


def _sharded_variant(cfg: RunConfig, loading: str) -> tuple[str, RunConfig] | None:
    """The change that makes a 4-bit run on the transformers path (the whole 4-bit model on each GPU while it
    loads) load sharded, where one exists: FSDP2 for an FSDP1 config, or sharded loading itself."""
    if loading != "transformers" or not cfg.quantization.use_4bit_quantization:
        return None
    auto = replace(cfg.model, loading="auto")
    if cfg.fsdp.version != 2:
        variant = replace(cfg, fsdp=replace(cfg.fsdp, version=2), model=auto)
        label = "FSDP2 with sharded loading (fsdp-tune convert --fsdp2: each rank reads and quantizes only its shards)"
    else:
        variant = replace(cfg, model=auto)
        label = "sharded loading (--loading sharded: each rank reads and quantizes only its shards)"
    return (label, variant) if why_not_sharded(variant) is None else None


def _variants(cfg: RunConfig, loading: str) -> list[tuple[str, RunConfig, float]]:
    """Changes that save memory, with a rough step-time cost factor used to rank them (cheapest first);
    long because it is the list itself: each change with the flags that make it."""
    out = []
    f = cfg.fsdp
    if not f.activation_checkpointing and not gradient_checkpointing(cfg):
        out.append(
            (
                "turn on FSDP activation checkpointing (fsdp_activation_checkpointing: true)",
                replace(cfg, fsdp=replace(f, activation_checkpointing=True)),
                1.33,
            )
        )
    micro = int(cfg.training.get("per_device_train_batch_size") or 8)
    if micro > 1:
        args = dict(
            cfg.training.args,
            per_device_train_batch_size=micro // 2,
            gradient_accumulation_steps=int(cfg.training.get("gradient_accumulation_steps") or 1) * 2,
        )
        out.append(
            (
                f"halve the micro-batch (--per_device_train_batch_size {micro // 2} "
                f"--gradient_accumulation_steps {args['gradient_accumulation_steps']}, same global batch)",
                replace(cfg, training=replace(cfg.training, args=args)),
                1.1,
            )
        )
    if cfg.lora.use_peft_lora and not cfg.quantization.use_4bit_quantization:
        q = replace(
            cfg.quantization,
            use_4bit_quantization=True,
            use_nested_quant=True,
            bnb_4bit_compute_dtype="bfloat16",
            bnb_4bit_quant_storage_dtype="bfloat16",
        )
        out.append(
            (
                "QLoRA: --use_4bit_quantization True --use_nested_quant True --bnb_4bit_quant_storage_dtype bfloat16",
                replace(cfg, quantization=q),
                1.5,
            )
        )
    if not f.cpu_offload:
        out.append(("offload to CPU (fsdp_offload_params: true)", replace(cfg, fsdp=replace(f, cpu_offload=True)), 3.0))
    lc = cfg.launch
    out.append(
        (
            f"twice the GPUs (--num_processes {lc.num_processes * 2})",
            replace(
                cfg,
                launch=replace(
                    lc,
                    num_processes=lc.num_processes * 2,
                    num_machines=lc.num_machines if lc.nproc_per_node < 8 else lc.num_machines * 2,
                ),
            ),
            1.0,
        )
    )
    return out


def _check(cfg: RunConfig, gpu_key: str, loading: str) -> str:
    """The model name to plan, or a UsageError that says what to pass."""
    name = cfg.model.model_name_or_path
    if not name:
        raise UsageError(
            "plan needs --model_name_or_path (a local folder, a config.json, or a known hub id)",
            "e.g. --model_name_or_path meta-llama/Llama-2-70b-hf (reference configs: fsdp_tune/sources/reference)",
        )
    try:
        find_config(name)
    except FileNotFoundError:
        raise UsageError(
            f"no config for {name}: not a local folder and not among the reference configs",
            "download its config.json and pass the file, or point at a local model folder",
        ) from None
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
) -> dict:
    """The plan `fsdp-tune plan` prints. `stack` replaces fsdp-tune's own code path (benchmarks/ uses it to
    plan a published run as it was made); `loading` is how the weights reach the ranks (LOADINGS): by default
    the path the run takes (launch/loading.py, as the rank spec decides it)."""
    loading, note = (loading, None) if loading else loading_path(cfg)
    name = _check(cfg, gpu_key, loading)
    gpu = GPUS[gpu_key]
    budget = parse_memory(gpu_memory) if gpu_memory else gpu.memory_gib
    shape = measure(name)
    est = estimate(cfg, shape, on_cpu=on_cpu, stack=stack, loading=loading)
    st = stack or stack_of(cfg, on_cpu)
    result = {
        "method": cfg.run.method,
        "model": {
            "name": name,
            "source": shape.source,
            "layers": shape.n_layers,
            "layer_class": shape.layer_class,
            "hidden_size": shape.hidden_size,
            "vocab_size": shape.vocab_size,
            "experts": f"{shape.top_k} of {shape.n_experts} per token" if shape.n_experts else None,
        },
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
        "advice": [],
    }
    if on_cpu:
        per_rank = est.cpu_rank_peak_bytes() / GiB
        result.update(per_gpu_memory_gib=None, per_rank_host_peak_gib=round(per_rank, 2), gpu_memory_gib=None)
        result.update(fits=True, range_gib=None, peak_allocated_gib=None, peak_phase=est.peak_phase)
        return result
    result.update(device_memory(est, budget))
    if not result["fits"]:
        result["advice"] = _advice(cfg, shape, budget, stack, loading)
    return result


def _advice(cfg: RunConfig, shape: ModelShape, budget: float, stack: Stack | None, loading: str) -> list[dict]:
    """Single changes that make it fit; on the transformers loading path of a 4-bit model (the whole model on
    each GPU while loading) each change is also tried together with the change to sharded loading."""

    def planned(variant: RunConfig, path: str) -> dict:
        return device_memory(estimate(variant, shape, stack=stack, loading=path), budget)

    sharded = _sharded_variant(cfg, loading)
    # (what to change, the variant, its step cost, loading path, the change it counts as: one option per change)
    tries = [(sharded[0], sharded[1], 1.0, "sharded", sharded[0])] if sharded else []
    first = planned(sharded[1], "sharded") if sharded else None
    alone = bool(first and first["fits"])
    for label, variant, cost in _variants(cfg, loading):
        tries.append((label, variant, cost, loading, label))
        if sharded and not alone:  # the change to sharded loading together with another
            both = _sharded_variant(variant, loading)
            if both:
                tries.append((f"{sharded[0]} and {label}", both[1], cost, "sharded", label))
    options, fitted = [], set()
    for i, (change, variant, cost, path, key) in enumerate(tries):
        v = first if i == 0 and first is not None else planned(variant, path)
        if v["fits"] and key not in fitted:
            fitted.add(key)
            options.append(
                {"change": change, "per_gpu_memory_gib": v["per_gpu_memory_gib"], "relative_step_cost": cost}
            )
    return sorted(options, key=lambda o: o["relative_step_cost"])
