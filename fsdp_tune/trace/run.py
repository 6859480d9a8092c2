"""The trace of one step: the run's rank spec on a simulated GPU machine, a fake process group of the run's world size,
the model built at two depths, one step traced at each, every phase extrapolated linearly to the model's depth.

Each trace runs a warm-up step first (FSDP's lazy init, AdamW's state, DTensor's propagation caches, which the
tracker would otherwise count), then the step that is measured."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.planner.method import step_of
from fsdp_tune.trace import build as builder
from fsdp_tune.trace import context, guard

GiB = 2**30
DEPTHS = (3, 4)  # the fewest layers with a first, a middle and a last one, and one more
STEP_NOTE = (
    "the policy's forward, then its no-grad forwards (DPO's reference; KTO's KL forward before it and two after) with "
    "the adapter off (a fresh adapter is the base; fsdp-tune's frozen 'ref' adapter is of the same size), the "
    "method's loss on each sequence's log-probabilities, the backward"
)
CP_NOTE = (
    "context parallelism: each micro-batch sharded as the Trainer shards it (torch's head-tail load balancing, "
    "1/cp of the sequence a rank) inside torch's context_parallel; attention through torch's ring "
    "(_templated_ring_attention and its backward: K/V gathered, fp32 merger and dq/dk/dv, dK/dV rotated), each "
    "block by SDPA's CPU flash kernel in the CUDA flash kernel's place (worker/cpu_cp.py): a block's output and "
    "fp32 logsumexp, never S x S scores; rank 0 of the ring traced"
)
MAX_MICRO_BATCHES = 2  # a third micro-batch of an accumulated step repeats the second's memory


@dataclass
class Trace:
    layers: int
    peaks: dict[str, tuple[int, dict[str, int]]]
    flops: float
    comm: dict[str, float]
    seconds: float
    notes: list[str] = field(default_factory=list)
    offload: bool = False  # sharded parameters, gradients and optimizer state in host memory
    uniform: bool = True  # every decoder layer the same size (what extrapolating in layers assumes)
    host_activations: int = 0  # the most bytes activation offload (save_on_cpu) held in host memory at once


def rank_spec(cfg: RunConfig):
    """The spec every rank of this run executes, decided for a machine with the run's GPUs."""
    from fsdp_tune.decide.machine import Machine
    from fsdp_tune.decide.rank import decide

    per_node = cfg.launch.nproc_per_node
    return decide(cfg, Machine(cuda=True, gpus=per_node, gpu_names=("simulated GPU",) * per_node))


def trace(cfg: RunConfig, depths: tuple[int, ...] | None = None) -> dict:
    """The traced peak and its categories at the model's depth, the step's FLOPs and collective bytes."""
    guard.check_settings(cfg)
    guard.check_versions(cfg.quantization.use_4bit_quantization)
    started = time.time()
    spec = rank_spec(cfg)
    full = builder.depth(spec)
    depths = tuple(d for d in (depths or DEPTHS) if d < full) or (full,)
    if len(depths) == 1:
        depths = (full,)
    traces = []
    for n in depths:
        traces.append(trace_at(spec, cfg, n))
        if not traces[-1].uniform and n < full:  # layers differ (a dense first few): no straight line through them
            traces = [trace_at(spec, cfg, full)]
            traces[0].notes.append(f"the decoder layers differ in size: all {full} traced, nothing extrapolated")
            break
    result = extrapolate(traces, full)
    if step_of(
        cfg
    ).no_grad_forwards:  # the step of TRL's DPOTrainer / KTOTrainer, with what stands in for the reference
        result["notes"] = [*result["notes"], f"{cfg.run.method}: {STEP_NOTE}"]
    if context.cp_size(spec) > 1:
        result["notes"] = [*result["notes"], CP_NOTE]
    result.update(world_size=spec.world.world_size, wall_s=round(time.time() - started, 1))
    result["ranks_per_node"] = spec.world.nproc_per_node
    sizes = spec.parallelism.sizes() if spec.parallelism is not None else {}
    result["mesh"] = {k: v for k, v in sizes.items() if v > 1} or None
    return result


def trace_at(spec, cfg: RunConfig, layers: int) -> Trace:
    """One step at `layers` decoder layers, in fake mode on a fake process group; the group is gone after."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    started = time.time()
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=spec.world.world_size, store=FakeStore())
    try:
        built = builder.build(spec, cfg, layers)
        problem = builder.check_sharding(built, spec.world.world_size)
        if problem is not None:  # a bug here, not the user's config: no peak is reported for such a build
            raise RuntimeError(f"plan --trace built {layers} layers sharded unlike the run: {problem}")
        return _run(spec, cfg, built, started)
    finally:
        dist.destroy_process_group()


def _run(spec, cfg: RunConfig, built, started: float) -> Trace:
    """Long because it is the order the pieces must come in: materialize, the warm-up step, then the measured step
    with the tracker below the CUDA stand-ins and the counters above them; under context parallelism all of it
    inside torch's ring attention (trace/context.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fsdp_tune.trace import step
    from fsdp_tune.trace.standins import Host, cuda_paths
    from fsdp_tune.trace.tracker import PhaseTracker

    micro, accumulation = spec.steps.per_device_train_batch_size, spec.steps.gradient_accumulation_steps
    micro_batches = min(accumulation, MAX_MICRO_BATCHES)
    clip = spec.steps.max_grad_norm
    method = cfg.run.method
    rows = micro * step_of(cfg).rows_with_grad  # DPO: the chosen and rejected rows, concatenated
    cp = context.cp_size(spec) > 1
    host = Host()
    with FakeTensorMode(allow_non_fake_inputs=True), _ring(spec, cp):
        builder.materialize(built)
        model = built.model
        step.fused_head(model, method)
        model.train()
        opt = step.optimizer(model, spec.steps.optim)
        vocab = model.get_input_embeddings().weight.shape[0]
        inputs = step.batch(vocab, rows, spec.data.max_seq_len)
        shard = context.sharder(built.parallelism_config, model) if cp else None
        run = dict(method=method, shard=shard)
        with cuda_paths():
            step.train_step(model, opt, inputs, micro_batches, spec.precision, clip, **run)
        tracker = PhaseTracker(model, opt, built.layer_classes, built.offload, model.get_input_embeddings())
        tracker.count(built.quant_tensors)
        tracker.track_inputs((inputs,))
        executed = step.Executed(context.in_ring)
        with tracker, cuda_paths(host), executed:  # the counters see bitsandbytes' matmul before its stand-in
            step.train_step(model, opt, inputs, micro_batches, spec.precision, clip, phase=tracker.mark, **run)
    scale = accumulation / micro_batches  # per optimizer step
    return Trace(
        layers=built.layers,
        peaks=tracker.peaks,
        flops=executed.flops * scale,
        comm={k: v * scale for k, v in executed.bytes.items()},
        seconds=time.time() - started,
        notes=built.notes,
        offload=built.offload,
        uniform=builder.uniform_layers(built),
        host_activations=host.peak,
    )


def _ring(spec, cp: bool):
    """torch's ring attention for SDPA's CPU kernel while the step runs (context parallelism only)."""
    if not cp:
        return contextlib.nullcontext()
    return context.ring(spec.parallelism.cp_comm_strategy or "allgather")


def _line(a: float, b: float, na: int, nb: int, n: int) -> float:
    return a + (b - a) * (n - na) / (nb - na)


def extrapolate(traces: list[Trace], full: int) -> dict:
    """Each phase's peak and categories, and the step's FLOPs and bytes, at `full` layers: linear through the two
    traces (all layers identical), or the one trace when it had every layer."""
    if len(traces) == 1:
        t = traces[0]
        phases = {k: (v, dict(c)) for k, (v, c) in t.peaks.items()}
        flops, comm, host = t.flops, dict(t.comm), t.host_activations
    else:
        a, b = traces
        phases = {}
        for key in a.peaks.keys() & b.peaks.keys():
            (va, ca), (vb, cb) = a.peaks[key], b.peaks[key]
            cats = {c: _line(ca.get(c, 0), cb.get(c, 0), a.layers, b.layers, full) for c in ca.keys() | cb.keys()}
            phases[key] = (_line(va, vb, a.layers, b.layers, full), cats)
        flops = _line(a.flops, b.flops, a.layers, b.layers, full)
        comm = {k: _line(a.comm.get(k, 0), b.comm.get(k, 0), a.layers, b.layers, full) for k in a.comm | b.comm}
        host = _line(a.host_activations, b.host_activations, a.layers, b.layers, full)
    peak = max(phases, key=lambda k: phases[k][0])
    total, cats = phases[peak]
    return {
        "peak_allocated_gib": round(total / GiB, 3),
        "peak_phase": peak,
        "categories_gib": {k: round(v / GiB, 4) for k, v in sorted(cats.items(), key=lambda kv: -kv[1]) if v > 0},
        "phases_gib": {k: round(v / GiB, 3) for k, (v, _) in sorted(phases.items(), key=lambda kv: -kv[1][0])},
        "phase_categories_gib": {
            k: {c: round(b / GiB, 3) for c, b in cs.items() if b >= GiB / 200} for k, (_, cs) in phases.items()
        },
        "layers": full,
        "layers_traced": [t.layers for t in traces],
        "extrapolated": len(traces) > 1,
        "tflops_per_step": round(flops / 1e12, 2),
        "flops_per_step": round(flops),
        "comm_gb_per_step": {k: round(v / 1e9, 3) for k, v in sorted(comm.items())},
        "comm_bytes_per_step": {k: round(v) for k, v in sorted(comm.items())},
        "trace_seconds": [round(t.seconds, 1) for t in traces],
        "notes": traces[-1].notes,
        "host_categories": host_categories() if traces[-1].offload else [],
        "host_activations_gib": round(host / GiB, 3),  # save_on_cpu's copies, the most at once
    }


def host_categories() -> list[str]:
    """What cpu_offload keeps in host memory: listed beside the device peak, not in it."""
    from fsdp_tune.trace.tracker import CATEGORY, HOST_WHEN_OFFLOADED

    return [CATEGORY[k] for k in HOST_WHEN_OFFLOADED]
