"""`fsdp-tune plan`: will it fit, where does the memory go, how long is a step, and what would make it fit."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from fsdp_tune.config.derived import gradient_checkpointing
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import UsageError
from fsdp_tune.planner.memory import GiB, estimate
from fsdp_tune.planner.shape import ModelShape, find_config, measure


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    bf16_tflops: float  # dense, public spec sheets
    link_gbs: float  # per-GPU collective bandwidth within a node (NVLink, or PCIe), GB/s
    host_gbs: float  # host <-> GPU copies (PCIe, one direction, pinned memory), GB/s: what cpu_offload pays


GPUS = {
    "h100": Gpu("H100 80GB SXM", 79.6, 989.0, 450.0, 50.0),  # PCIe Gen5 x16
    "h200": Gpu("H200 141GB SXM", 139.8, 989.0, 450.0, 50.0),
    "a100": Gpu("A100 80GB SXM", 79.2, 312.0, 300.0, 25.0),  # PCIe Gen4 x16
    "4090": Gpu("RTX 4090 24GB", 23.6, 165.0, 25.0, 25.0),
}
ASSUMED_MFU = 0.45  # the fraction of peak a well-fed bf16 LoRA step reaches; a stated assumption, not a measurement


def parse_memory(text: str) -> float:
    m = re.fullmatch(r"\s*([\d.]+)\s*(gib|gb|g|mib|mb)?\s*", text.lower())
    if not m:
        raise UsageError(f"--gpu_memory {text}: not a size", "e.g. 80GiB, 24GB")
    value, unit = float(m.group(1)), m.group(2) or "gib"
    return value * {"gib": 1, "g": 1, "gb": 1e9 / GiB, "mib": 1 / 1024, "mb": 1e6 / GiB}[unit]


def step_time(cfg: RunConfig, shape: ModelShape, gpu: Gpu) -> dict:
    """FLOPs and communication of one optimizer step per GPU, and a time from the GPU's public figures."""
    world = max(cfg.launch.num_processes, 1)
    micro = int(cfg.training.get("per_device_train_batch_size") or 8)
    accum = int(cfg.training.get("gradient_accumulation_steps") or 1)
    tokens = micro * cfg.data.max_seq_len * accum
    n = shape.total_params
    lora = cfg.lora.use_peft_lora
    # forward 2N; backward 2N for activation gradients, + 2N weight gradients when every weight trains;
    # + a second forward under activation checkpointing
    per_token = 2 * n + 2 * n + (0 if lora else 2 * n)
    if cfg.fsdp.activation_checkpointing or gradient_checkpointing(cfg):
        per_token += 2 * n
    attention = 4 * shape.n_layers * shape.hidden_size * cfg.data.max_seq_len * (3 if not lora else 2.5)
    flops = tokens * (per_token + attention)
    weight_bytes = n * 2 if not cfg.quantization.use_4bit_quantization else n * 0.53
    gathers = (2 if cfg.fsdp.reshard_after_forward else 1) * accum
    comm = weight_bytes * gathers * (world - 1) / world if world > 1 else 0.0
    if not lora:
        comm += n * 4 * (world - 1) / world  # reduce-scatter of fp32 gradients
    host = 0.0
    if cfg.fsdp.cpu_offload:
        # every all-gather first copies this rank's shard to the GPU; gradients of what trains come back
        host = weight_bytes / world * gathers + (n * 4 / world if not lora else 0.0)
    compute_s = flops / (gpu.bf16_tflops * 1e12 * ASSUMED_MFU)
    comm_s = comm / (gpu.link_gbs * 1e9)
    host_s = host / (gpu.host_gbs * 1e9)
    # FSDP overlaps the next all-gather (and its host copy) with the current compute: the slowest one sets the pace
    times = {"compute": compute_s, "communication": comm_s, "host transfers": host_s}
    step_s = max(times.values())
    return {
        "tokens_per_step_per_gpu": tokens,
        "tflops_per_step_per_gpu": flops / 1e12,
        "comm_gb_per_step_per_gpu": comm / 1e9,
        "host_transfer_gb_per_step_per_gpu": host / 1e9,
        "compute_s": compute_s,
        "comm_s": comm_s,
        "host_transfer_s": host_s,
        "step_s": step_s,
        "tokens_per_s_per_gpu": tokens / step_s if tokens else 0.0,
        "assumed_mfu": ASSUMED_MFU,
        "bound": max(times, key=times.get),
    }


def _variants(cfg: RunConfig) -> list[tuple[str, RunConfig, float]]:
    """Changes that save memory, with a rough step-time cost factor used to rank them (cheapest first)."""
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


def memory_plan(cfg: RunConfig, gpu_key: str = "h100", gpu_memory: str | None = None, on_cpu: bool = False) -> dict:
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
    gpu = GPUS[gpu_key]
    budget = parse_memory(gpu_memory) if gpu_memory else gpu.memory_gib
    shape = measure(name)
    est = estimate(cfg, shape, on_cpu=on_cpu)
    per_device = (est.cpu_rank_peak_bytes() if on_cpu else est.device_bytes) / GiB
    result = {
        "model": {
            "name": name,
            "source": shape.source,
            "layers": shape.n_layers,
            "layer_class": shape.layer_class,
            "hidden_size": shape.hidden_size,
            "vocab_size": shape.vocab_size,
        },
        "total_params": est.total_params,
        "trainable_params": est.trainable_params,
        "world_size": cfg.launch.num_processes,
        "device": "cpu" if on_cpu else gpu.name,
        "per_gpu_memory_gib": None if on_cpu else round(per_device, 2),
        "per_rank_host_peak_gib": round(per_device, 2) if on_cpu else None,
        "gpu_memory_gib": None if on_cpu else round(budget, 1),
        "fits": True if on_cpu else per_device <= budget,
        "host_memory_gib_per_node": round(est.host_node_bytes / GiB, 2),
        "host_memory_gib_per_node_steady": round(est.host_node_steady_bytes / GiB, 2),
        "components": {k: round(v / GiB, 3) for k, v in est.device.items()},
        "host_components": {k: round(v / GiB, 3) for k, v in est.host_node.items()},
        "notes": est.notes,
        "step_time": None if on_cpu else step_time(cfg, shape, gpu),
        "advice": [],
    }
    if not on_cpu and not result["fits"]:
        options = []
        for label, variant, cost in _variants(cfg):
            v = estimate(variant, shape).device_bytes / GiB
            if v <= budget:
                options.append({"change": label, "per_gpu_memory_gib": round(v, 2), "relative_step_cost": cost})
        result["advice"] = sorted(options, key=lambda o: o["relative_step_cost"])
    return result
