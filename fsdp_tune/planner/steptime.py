"""Step time from FLOPs and bytes moved: what a GPU's public figures allow, at an assumed utilisation."""

from __future__ import annotations

import re

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import cp_degree, gradient_checkpointing, shard_group
from fsdp_tune.decide.gpus import Gpu
from fsdp_tune.decide.method import steps
from fsdp_tune.errors import UsageError
from fsdp_tune.planner.experts import expert_parallel
from fsdp_tune.planner.memory import GiB, offloaded_activation_bytes
from fsdp_tune.planner.method import step_of
from fsdp_tune.planner.shape import ModelShape
from fsdp_tune.planner.stack import stack_of
from fsdp_tune.planner.terms import ring_bytes_sent
from fsdp_tune.planner.weights import lora_on_rank

ASSUMED_MFU = 0.45  # the fraction of peak a well-fed bf16 LoRA step reaches; a stated assumption, not a measurement


def parse_memory(text: str) -> float:
    m = re.fullmatch(r"\s*([\d.]+)\s*(gib|gb|g|mib|mb)?\s*", text.lower())
    if not m:
        raise UsageError(f"--gpu_memory {text}: not a size", "e.g. 80GiB, 24GB")
    value, unit = float(m.group(1)), m.group(2) or "gib"
    return value * {"gib": 1, "g": 1, "gb": 1e9 / GiB, "mib": 1 / 1024, "mb": 1e6 / GiB}[unit]


def fsdp2_gathered(cfg: RunConfig, shape: ModelShape, world: int, no_grad_forwards: int = 0) -> float:
    """Bytes one micro-batch all-gathers under FSDP2, as the trace counts them (`plan --trace`): every layer in the
    forward and again in the backward when resharded, the input embedding likewise (layer 0's backward prefetches
    it), lm_head's weight once (TRL's fused head: full_tensor); 4-bit layers packed, LoRA as FSDP2 pads it, the
    embedding and head in the compute dtype. A no-grad forward (DPO's reference, KTO's KL) gathers every layer,
    the embedding and the head once more (not traced: the trace runs SFT's step)."""
    from fsdp_tune.planner import gathered

    u = gathered.units(cfg, shape, stack_of(cfg, model=shape.facts), max(world, 2))
    times = 2 if gathered.resharded(cfg) else 1
    edges = u["embed"] if shape.tied_head else times * u["embed"] + u["head"]
    forward = shape.n_layers * u["layer"] + u["embed"] + (0 if shape.tied_head else u["head"])
    return times * shape.n_layers * u["layer"] + edges + no_grad_forwards * forward


def step_time(cfg: RunConfig, shape: ModelShape, gpu: Gpu, generation_once: bool = False) -> dict:
    """FLOPs and communication of one optimizer step per GPU, and a time from the GPU's public figures.
    It is long because it is one account of a step's compute, collectives (FSDP's and context parallelism's ring) and
    host transfers, term by term."""
    world = shard_group(cfg)  # all-gathers and reduce-scatters run within a shard group
    st = stack_of(cfg, model=shape.facts)
    batch = steps(cfg)  # the typed Steps, the method's config defaults filled in (decide/method.py)
    micro, accum = batch.per_device_train_batch_size, batch.gradient_accumulation_steps
    step = step_of(cfg)  # DPO and reward models: chosen and rejected rows; DPO/KTO: no-grad forwards besides
    tokens = micro * step.rows_with_grad * cfg.data.max_seq_len * accum // cp_degree(cfg)
    n = shape.active_params  # MoE: a token runs its top-k experts, not all of them
    lora = cfg.lora.use_peft_lora
    # forward 2N; backward 2N for activation gradients, + 2N weight gradients when every weight trains;
    # + a second forward under activation checkpointing
    per_token = 2 * n + 2 * n + (0 if lora else 2 * n)
    if cfg.fsdp.activation_checkpointing or gradient_checkpointing(cfg):
        per_token += 2 * n
    per_token += 2 * n * step.no_grad_forwards * step.no_grad_rows / step.rows_with_grad  # reference, KL forwards
    attention = 4 * shape.n_layers * shape.hidden_size * cfg.data.max_seq_len * (3 if not lora else 2.5)
    flops = tokens * (per_token + attention)
    total = shape.total_params  # every expert is all-gathered, routed to or not
    weight_bytes = total * 2 if not cfg.quantization.use_4bit_quantization else total * 0.53
    gathers = ((2 if cfg.fsdp.reshard_after_forward else 1) + step.no_grad_forwards) * accum
    gathered = weight_bytes * gathers
    if cfg.fsdp.version == 2:
        gathered = fsdp2_gathered(cfg, shape, world, step.no_grad_forwards) * accum
    # every unit per generated token, or once (generation_once: planner/generating.py)
    if row_of(cfg.run.method).generates:
        from fsdp_tune.planner import generating

        one_forward = fsdp2_gathered(cfg, shape, world, 1) - fsdp2_gathered(cfg, shape, world, 0)
        more_flops, more_gathered = generating.generation_cost(cfg, shape, one_forward, generation_once)
        flops, gathered = flops + more_flops, gathered + more_gathered
    comm = gathered * (world - 1) / world if world > 1 else 0.0
    if cfg.fsdp.version == 2 and lora and world > 1:  # the adapters' gradients, reduce-scattered as gathered
        grads = lora_on_rank(cfg, shape, world)[1] * shape.n_layers * st.compute_bytes
        comm += grads * accum * (world - 1) / world
    if not lora:
        comm += total * 4 * (world - 1) / world  # reduce-scatter of fp32 gradients
    checkpointed = cfg.fsdp.activation_checkpointing or gradient_checkpointing(cfg)
    ring = accum * ring_bytes_sent(shape, st, tokens // accum, cp_degree(cfg), 2 if checkpointed else 1)
    comm += ring  # context parallelism's K/V ring shares the link with FSDP's collectives
    ep = expert_parallel(cfg, shape, stack_of(cfg).compute_bytes)
    comm += ep["all_to_all_gb_per_step_per_gpu"] * 1e9 if ep else 0.0  # the experts' token exchange
    host = 0.0
    if cfg.fsdp.cpu_offload:
        # every all-gather first copies this rank's shard to the GPU; gradients of what trains come back
        host = gathered / world + (total * 4 / world if not lora else 0.0)
    if cfg.fsdp.activation_checkpointing_offload and checkpointed and cfg.fsdp.version == 2:
        host += 2 * accum * offloaded_activation_bytes(cfg, shape, st)  # out in the forward, back in
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
        "ring_gb_per_step_per_gpu": ring / 1e9,
        "host_transfer_gb_per_step_per_gpu": host / 1e9,
        "compute_s": compute_s,
        "comm_s": comm_s,
        "host_transfer_s": host_s,
        "step_s": step_s,
        "tokens_per_s_per_gpu": tokens / step_s if tokens else 0.0,
        "assumed_mfu": ASSUMED_MFU,
        "bound": max(times, key=times.get),
    }
