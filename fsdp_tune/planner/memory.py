"""The planner's arithmetic: bytes per component for one rank, per phase of a step, from the typed config,
the model's shape and the code path (planner/stack.py). Pure (no torch).

No constant here is fitted to a published measurement. Per-token and per-logit terms come from reading
the code the ranks run (planner/terms.py, checked on CPU by tests/lib/test_planner_terms.py); static
terms from the dtypes and FSDP's sharding. What the formula predicts is peak *allocated* memory (what
torch.cuda.max_memory_allocated reports): the sum of live tensors, at the phase of the step where it is
largest. The caching allocator's reserve and the CUDA context are added separately in planner/plan.py,
as a range, because only part of them follows from the code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import cp_degree, mesh_active, mesh_sizes, model_dtype, shard_group
from fsdp_tune.decide.method import steps
from fsdp_tune.planner import gathered, generating, host
from fsdp_tune.planner.adapters import expert_copy_bytes
from fsdp_tune.planner.method import REFERENCE_PHASE, loss_terms, reference_phase, step_of
from fsdp_tune.planner.method import note as method_note
from fsdp_tune.planner.shape import ModelShape
from fsdp_tune.planner.stack import Stack, stack_of
from fsdp_tune.planner.terms import (
    checkpoint_kept,
    layer_backward_transients,
    layer_saved,
    loss_bytes,
    quantized_backward,
    ring_attention,
    ring_moment,
)
from fsdp_tune.planner.vision import add_tower
from fsdp_tune.planner.weights import (
    DTYPE_BYTES,
    adapters_of,
    base_bytes,
    lora_on_rank,
    lora_params,
    pinned_per_param,
    quant_constant_bytes,
)

GiB = 2**30
LOADINGS = ("transformers", "sharded")
STATIC_KEYS = (
    "sharded base weights",
    "4-bit quantization constants (not sharded)",
    "trainable params, grads, optimizer",
)
PHASES = ("loss (end of forward)", "loss backward", "last layer's backward", "optimizer step")


@dataclass
class Estimate:
    """Bytes per component for one rank on the device (GPU, or host for a CPU run), and per node on host."""

    device: dict[str, float] = field(default_factory=dict)  # static + the peak phase's transients
    phases: dict[str, float] = field(default_factory=dict)  # every phase's total
    peak_phase: str = ""
    stream_pool: float = 0.0  # all-gather buffers cached in FSDP's own stream pool, beyond the peak's
    gpu_loading: float = 0.0  # device bytes while the model loads (before FSDP shards it)
    host_node: dict[str, float] = field(default_factory=dict)
    load_per_rank: float = 0.0
    loading: str = "transformers"  # the loading path planned (LOADINGS)
    trainable_params: int = 0
    total_params: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def device_bytes(self) -> float:
        """Peak allocated on one device: the larger of the training peak and the loading phase."""
        return max(sum(self.device.values()), self.gpu_loading)

    @property
    def host_node_bytes(self) -> float:
        return host.node_peak(self.host_node)

    @property
    def host_node_steady_bytes(self) -> float:
        return host.node_steady(self.host_node)

    def cpu_rank_peak_bytes(self) -> float:
        static = sum(v for k, v in self.device.items() if k in STATIC_KEYS)
        return host.cpu_rank_peak(self.device, self.load_per_rank, self.loading, static)


def micro_tokens(cfg: RunConfig) -> int:
    """Tokens of one micro-batch on one rank that keep activations: context parallelism gives each rank 1/cp of
    every sequence; DPO and reward models run chosen and rejected rows together (planner/method.py)."""
    rows = steps(cfg).per_device_train_batch_size * step_of(cfg).rows_with_grad
    return rows * cfg.data.max_seq_len // cp_degree(cfg)


def activations_offloaded(cfg: RunConfig, st: Stack) -> bool:
    """accelerate's activation_checkpointing_offload: offload_wrapper puts save_on_cpu around each checkpointed
    layer (accelerate/utils/fsdp_utils.py), so what checkpointing keeps (the layers' inputs) lives in host RAM and
    comes back one layer at a time for its recompute (FT032: FSDP2 with activation checkpointing only)."""
    return cfg.fsdp.activation_checkpointing_offload and st.checkpointing != "none" and st.fsdp_version == 2


def offloaded_activation_bytes(cfg: RunConfig, shape: ModelShape, st: Stack) -> float:
    """Bytes of checkpointed layer inputs one rank moves to host RAM (0 without activation offload)."""
    if not activations_offloaded(cfg, st):
        return 0.0
    return shape.n_layers * micro_tokens(cfg) * checkpoint_kept(shape, st)


def transient_phases(cfg: RunConfig, shape: ModelShape, st: Stack, world: int, size=None) -> dict[str, dict]:
    """Every phase's transient components (bytes), long because it is one account of a step, phase by
    phase: splitting it would scatter the terms that must add up."""
    ad = adapters_of(cfg)
    n_lora = lora_params(cfg, shape)
    tokens, seq = micro_tokens(cfg), cfg.data.max_seq_len // cp_degree(cfg)
    quantized = cfg.quantization.use_4bit_quantization
    saved = layer_saved(shape, st, ad, seq, quantized)
    if st.checkpointing != "none":  # with activation offload one layer's input is back on the device at a time
        layers_kept = 1 if activations_offloaded(cfg, st) else shape.n_layers
        kept = layers_kept * tokens * checkpoint_kept(shape, st)
        recompute = tokens * saved
    else:
        kept = (
            shape.n_layers * tokens * (saved + (st.compute_bytes * shape.hidden_size if st.compute_bytes == 4 else 0))
        )
        recompute = 0.0
    u = gathered.units(cfg, shape, st, world)
    resharded = gathered.resharded(cfg)
    units = 2 if resharded else shape.n_layers
    fsdp2 = st.fsdp_version == 2 and world > 1
    resident, edge, held_output = gathered.edges(st, shape, u, resharded, fsdp2)
    always = 0.0 if units == 2 else units * u["layer"]
    head_trains = ad.full
    fwd_loss, bwd_loss = loss_terms(cfg, tokens, shape.hidden_size, loss_bytes(tokens, shape, st, head_trains))
    act = "activations (every layer)" if st.checkpointing == "none" else "activations kept (checkpointed layers)"
    phases = {
        PHASES[0]: {act: kept, "gathered FSDP units": edge + always + held_output, "logits and loss": fwd_loss},
        PHASES[1]: {
            act: kept,
            "gathered FSDP units": edge + always + (u["layer"] if units == 2 else 0),
            "logits and loss": bwd_loss,
        },
        PHASES[2]: {
            act: kept,
            "gathered FSDP units": resident + (units * u["layer"]),
            "recomputed layer": recompute,
            "backward transients (one layer)": tokens * layer_backward_transients(shape, st, seq),
        },
        PHASES[3]: {},
    }
    copies = expert_copy_bytes(cfg, shape, st)
    if copies:  # LoRA on fused experts: W + BA per MoE layer, saved for backward (planner/adapters.py)
        held = 0.0 if st.checkpointing != "none" else shape.n_layers * copies
        for phase in PHASES[:3]:
            phases[phase]["experts rebuilt with their LoRA"] = copies if phase == PHASES[2] and not held else held
    if quantized:  # the larger of the layer's backward moments: its transients, or a 4-bit matmul's backward
        grads, dequantized = quantized_backward(shape, st, tokens)
        backward = phases[PHASES[2]]
        if grads + dequantized > backward["backward transients (one layer)"]:
            backward.update({"backward transients (one layer)": grads, "4-bit dequantized weight": dequantized})
    ring = ring_attention(shape, st, tokens, cp_degree(cfg), cfg.parallelism.cp_comm_strategy)
    if ring:  # context parallelism: the layer's backward peaks in its MLP or in its ring attention, after the MLP
        _ring_or_mlp(phases[PHASES[2]], *ring_moment(shape, st, ad, tokens, quantized), ring)
    if ad.full and world > 1:  # unsharded grads of a unit and the retained reduce-scatter input
        grad_bytes = st.compute_bytes if st.pure_bf16 else 4
        phases[PHASES[2]]["unsharded grads, reduce-scatter buffer"] = 2 * grad_bytes * u["layer"] / st.compute_bytes
    if fsdp2:
        phases.update(gathered.fsdp2_phases(phases, PHASES[2], act, u, shape, resharded))
    head = shape.vocab_size * shape.hidden_size * st.compute_bytes  # TRL's fused head: lm_head.full_tensor()
    loss_fwd = lambda n: loss_bytes(n, shape, st)[0]  # noqa: E731
    step = step_of(cfg)
    scale = step.no_grad_rows / step.rows_with_grad
    again = gathered.no_grad_forwards(phases, act, kept, shape.n_layers, scale) if fsdp2 and step.no_grad_rows else []
    ref = reference_phase(cfg, phases[PHASES[0]], tokens, saved, loss_fwd, head, again)
    if ref is not None:  # DPO/KTO: the no-grad forwards, while the policy's activations are kept
        phases[REFERENCE_PHASE] = ref
    add_tower(phases, PHASES[:3], cfg, shape, st.compute_bytes, size)  # a vision tower that trains (planner/vision.py)
    if row_of(cfg.run.method).generates:  # GRPO: generation and log-prob passes before the step (planner/generating.py)
        phases.update(generating.phases(cfg, shape, st, u, saved, head, loss_fwd))
    if st.foreach_adam:  # torch/optim/adam.py _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(...)
        trainable = n_lora if cfg.lora.use_peft_lora else shape.total_params
        phases[PHASES[3]]["AdamW foreach temporaries"] = trainable * st.trainable_bytes / 4 / world
    return phases


RING = "ring attention: K/V in flight, fp32 grads"


def _ring_or_mlp(backward: dict, saved: float, grads: float, ring: float) -> None:
    """The layer's backward phase at the larger of its two moments: the MLP's (as built: the recomputed layer, its
    backward transients or a 4-bit backward's) or the ring attention's (terms.ring_moment: the MLP's saves freed,
    the ring's buffers and the residual gradients alive)."""
    moments = ("recomputed layer", "backward transients (one layer)", "4-bit dequantized weight")
    if saved + grads + ring <= sum(backward.get(k, 0.0) for k in moments):
        backward[RING] = 0.0  # not in the peak: shown as such
        return
    backward.pop("4-bit dequantized weight", None)
    backward.update({"recomputed layer": saved, "backward transients (one layer)": grads, RING: ring})


def static_components(cfg: RunConfig, shape: ModelShape, st: Stack, world: int, offload: bool) -> dict:
    shard = base_bytes(cfg, shape, st)[0] / world
    if not cfg.lora.use_peft_lora and not cfg.quantization.use_4bit_quantization:
        shard = 0.0  # full fine-tuning: the trainable master weights are the weights
    train_state = trainable_state(cfg, shape, st, world)
    return {
        "sharded base weights": 0.0 if offload else shard,
        "4-bit quantization constants (not sharded)": quant_constant_bytes(cfg, shape, st, world),
        "trainable params, grads, optimizer": 0.0 if offload else train_state,
    }


def trainable_state(cfg: RunConfig, shape: ModelShape, st: Stack, world: int) -> float:
    """Trainable weights, grads and optimizer state one rank holds (LoRA as FSDP2 pads its shards)."""
    if not cfg.lora.use_peft_lora:
        return shape.total_params * st.trainable_bytes / world
    return lora_on_rank(cfg, shape, world, st.fsdp_version)[0] * st.trainable_bytes


def gpu_loading_bytes(cfg: RunConfig, shape: ModelShape, world: int, loading: str, offload: bool = False) -> float:
    """Device bytes while loading, before FSDP shards the model. transformers 5.24 quantizes 4-bit models on
    the GPU (quantizer_bnb_4bit.py: device_map = the current device; the meta-init shortcut is skipped for
    quantized models): each rank holds the whole 4-bit model, one bf16 weight in flight. A model that is not
    quantized loads on the host. The sharded path holds the rank's shards and one bf16 layer in flight."""
    if not cfg.quantization.use_4bit_quantization:
        return 0.0
    whole, _ = base_bytes(cfg, shape)
    consts = quant_constant_bytes(cfg, shape)
    if loading == "sharded":
        return (0.0 if offload else whole / world) + consts + shape.layer_params * 2
    biggest = max((lin.in_features * lin.out_features for lin in shape.layer_linears), default=0)
    return whole + consts + biggest * 2


def estimate(
    cfg: RunConfig,
    shape: ModelShape,
    on_cpu: bool = False,
    stack: Stack | None = None,
    loading: str = "transformers",
    image_size: tuple[int, int] | None = None,
) -> Estimate:
    """Every component of one rank's memory at the peak of a step, with every phase's total (image_size: vision.py)."""
    st = stack or stack_of(cfg, on_cpu, shape.facts)
    world = shard_group(cfg)  # the ranks a parameter is sharded over (every rank, or a mesh's shard group)
    offload = cfg.fsdp.cpu_offload and not on_cpu
    est = Estimate(total_params=shape.total_params, loading=loading)
    est.trainable_params = lora_params(cfg, shape) if cfg.lora.use_peft_lora else shape.total_params
    static = static_components(cfg, shape, st, world, offload)
    phases = transient_phases(cfg, shape, st, world, image_size)
    est.phases = {name: sum(static.values()) + sum(items.values()) for name, items in phases.items()}
    est.peak_phase = max(est.phases, key=est.phases.get)
    est.device = {**static, **phases[est.peak_phase]}
    if st.all_gather_stream_pool and world > 1:
        # FSDP all-gathers into buffers of its own stream; that stream's cache keeps two units' worth
        # (the one in use and the prefetched one), whatever the peak phase holds live
        u = gathered.units(cfg, shape, st, world)
        live = phases[est.peak_phase].get("gathered FSDP units", 0.0)
        est.stream_pool = max(0.0, 2 * u["layer"] + (u["root"] if st.fsdp_version == 1 else u["head"]) - live)
    if on_cpu:
        est.device[host.RUNTIME] = host.HOST_RUNTIME_GIB["cpu"] * GiB
    else:
        est.gpu_loading = gpu_loading_bytes(cfg, shape, world, loading, offload)
        if est.gpu_loading > sum(est.device.values()):
            est.notes.append(
                f"the peak is while loading ({loading} loading path): each rank holds "
                f"{est.gpu_loading / GiB:.1f} GiB before FSDP shards the model"
            )
    _host(cfg, shape, st, est, on_cpu, loading, static)
    est.notes += [n for n in (method_note(cfg),) if n] + mesh_notes(cfg)
    return est


def mesh_notes(cfg: RunConfig) -> list[str]:
    if not mesh_active(cfg):
        return []
    sizes = {k.removesuffix("_size"): v for k, v in mesh_sizes(cfg).items() if v > 1}
    notes = [
        "device mesh " + " x ".join(f"{k} {v}" for k, v in sizes.items()) + f": weights and trainable state are "
        f"sharded over {shard_group(cfg)} ranks (dp_shard x cp) and replicated across dp_replicate; all-gathers "
        "stay within a shard group"
    ]
    if cp_degree(cfg) > 1:
        notes.append(
            f"context parallelism: each rank holds 1/{cp_degree(cfg)} of every sequence's activations; the ring "
            f"attention's K/V blocks ({cfg.parallelism.cp_comm_strategy}) and fp32 dq/dk/dv are counted in the "
            "layer's backward, at the attention's moment (after the MLP's)"
        )
        notes.append(
            "context parallelism assumes SDPA runs its flash, memory-efficient or cuDNN kernel on every block (the "
            "only ones torch's ring handles: _context_parallel/_attention.py custom_ops); SDPA falling back to its "
            "math kernel is not planned: it would hold the blocks' scores (local tokens x the sequence, per head) "
            "and run far slower (TRL#3994)"
        )
    if sizes.get("tp", 1) > 1:
        notes.append("tensor parallelism is not modelled: weights and activations per rank are over-counted")
    return notes


def _host(
    cfg: RunConfig, shape: ModelShape, st: Stack, est: Estimate, on_cpu: bool, loading: str, static: dict
) -> None:
    world = shard_group(cfg)
    local = cfg.launch.nproc_per_node
    all_base, layer = base_bytes(cfg, shape, st)
    consts = quant_constant_bytes(cfg, shape)
    checkpoint = shape.total_params * DTYPE_BYTES[model_dtype(cfg)]
    full_model = all_base + consts if cfg.quantization.use_4bit_quantization else checkpoint
    if on_cpu and loading == "transformers" and cfg.quantization.use_4bit_quantization:
        full_model += checkpoint  # from_pretrained quantizes on the host from the checkpoint's pages
    on_host = on_cpu or cfg.fsdp.cpu_offload  # where a rank's shards live while it loads them
    adapters = lora_params(cfg, shape) * 4 if cfg.lora.use_peft_lora else 0.0  # PEFT makes them in fp32
    est.load_per_rank = host.loading_per_rank(
        loading, full_model, full_model / world, shape.layer_params * 2, on_host, adapters
    )
    h = est.host_node
    h[host.RUNTIME] = host.HOST_RUNTIME_GIB["cpu" if on_cpu else "cuda"] * GiB * local
    h[f"{host.LOADING} model copies ({loading} loading)"] = est.load_per_rank * local
    if cfg.fsdp.cpu_offload and not on_cpu:
        _offload_host(cfg, shape, st, est, world, local, layer)
    if offloaded_activation_bytes(cfg, shape, st) and not on_cpu:
        moved = offloaded_activation_bytes(cfg, shape, st)
        h[f"{host.TRAINING} checkpointed activations (save_on_cpu)"] = moved * local
        est.notes.append(
            f"activation offload: the checkpointed layer inputs ({moved / GiB:.1f} GiB per rank) live in host RAM; "
            "one layer's comes back for its recompute"
        )
    if on_cpu:
        h[f"{host.TRAINING} every rank's training memory"] = (
            sum(v for k, v in est.device.items() if k != host.RUNTIME) * local
        )


def _offload_host(
    cfg: RunConfig, shape: ModelShape, st: Stack, est: Estimate, world: int, local: int, layer: float
) -> None:
    train_state = trainable_state(cfg, shape, st, world)
    h = est.host_node
    if not cfg.lora.use_peft_lora and not cfg.quantization.use_4bit_quantization:
        h[f"{host.TRAINING} offloaded fp32 weights, grads, AdamW"] = train_state * local
        est.notes.append("cpu_offload: the fp32 weights, their gradients and AdamW live in host RAM")
        return
    shard = base_bytes(cfg, shape, st)[0] / world
    units = [layer / world] * shape.n_layers + [(shard * world - layer * shape.n_layers) / world]
    h.update(host.offloaded(cfg.fsdp.version, units, pinned_per_param(cfg, shape, world), shard, local))
    h[f"{host.TRAINING} offloaded trainable state"] = train_state * local
    est.notes.append(
        "cpu_offload (FSDP1): pinned weight shards and a pinned gradient buffer for every unit, frozen ones "
        "included; FSDP2 offloads gradients of trainable parameters only"
        if cfg.fsdp.version == 1
        else "cpu_offload: sharded weights and trainable state live in host RAM"
    )
