"""The planner's arithmetic: bytes per component for one rank, from the typed config and a model shape.

Pure (no torch). Every constant below is a named, documented assumption; the components are summed per
phase (loading, training) and the peak is the larger phase, because the loading copy is freed before
training starts.

Sources for the model: the FSDP2 design (all-gather one unit, free after use, prefetch the next),
Korthikanti et al. 2022 for what a transformer layer keeps for backward (adapted to Llama: RMSNorm,
rotary, SwiGLU; with SDPA/flash attention no s^2 term), bitsandbytes' 4-bit layout (blocksize 64,
fp32 absmax, or 8-bit absmax + fp32 second level with nested quantization).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsdp_tune.config.derived import compute_precision, gradient_checkpointing, model_dtype, quant_storage
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.planner.shape import ModelShape

GiB = 2**30
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# --- assumptions (see the module docstring) -------------------------------------------------------------
FOUR_BIT_BYTES = 0.5  # packed NF4/FP4 values, whatever the storage dtype (bf16 storage packs 4 per element)
QUANT_CONST_BYTES = 4 / 64  # fp32 absmax per block of 64
NESTED_CONST_BYTES = 1 / 64 + 4 / (64 * 256)  # 8-bit absmax + fp32 per 256 blocks
ADAM_BYTES = 8  # exp_avg + exp_avg_sq in fp32
LORA_PARAM_BYTES = 4  # PEFT keeps adapters in fp32 (autocast_adapter_dtype)
PREFETCH_UNITS = 2  # the unit computing and the one being all-gathered
LOSS_BYTES_PER_LOGIT = 8  # fp32 upcast of the logits in the loss + its gradient (on top of the logits)
CUDA_CONTEXT_GIB = 1.0  # CUDA context, cuBLAS workspaces, NCCL buffers
# What the caching allocator reserves beyond the transient allocations (gathered units, activations and
# their recompute, logits, dequantization buffers): blocks cached across the forward / recompute / backward
# cycle, split-block fragmentation, and the backward's short-lived gradient buffers that the components do
# not itemise. Persistent allocations (weight shards, quantization state, LoRA state) are made once at
# start-up and get no overhead. FITTED, not derived: this one constant brings all three figures of PEFT's
# FSDP guide (70B LoRA on 8 GPUs, 70B QLoRA on 2 with and without offload) within 6%; tests/dist/test_plan.py
# checks them, so those tests confirm the model's shape (one constant, three figures), not its constant.
ALLOCATOR_OVERHEAD = 0.5
HOST_RUNTIME_GIB = {"cuda": 3.0, "cpu": 0.53}  # a rank's process with torch & the HF stack imported
CPU_ALLOCATOR_OVERHEAD = 0.05
# While loading on CPU, RSS holds the model two to three times: the tensors from_pretrained materialises,
# the memory-mapped checkpoint pages it copies from (RSS counts them once faulted in, though the kernel can
# reclaim them), and a transient copy as fully_shard replaces parameters with shards. Measured with
# transformers 5.24 on a 125M-parameter Llama (2 ranks, 0.46 GiB in fp32, 0.53 GiB runtime): 1.52 to 1.95
# GiB peak per rank across runs. The planner takes the middle. GPU host-RAM plans count one copy.
LOAD_RSS_FACTOR = 2.5
# host-RAM components belong to one phase or to both (no prefix); the peak takes the larger phase
LOADING, TRAINING = "loading:", "training:"
FIRST_STEP = f"{TRAINING} first step:"  # training-phase memory that is freed during the first step


@dataclass
class Estimate:
    """Bytes per component for one rank on the device (GPU, or host for a CPU run), and per node on host."""

    device: dict[str, float] = field(default_factory=dict)
    host_node: dict[str, float] = field(default_factory=dict)
    load_per_rank: float = 0.0
    trainable_params: int = 0
    total_params: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def device_bytes(self) -> float:
        return sum(self.device.values())

    @property
    def host_node_bytes(self) -> float:
        """Peak host RAM per node: the runtime, plus the larger of the loading and the training phase (the
        loading copies are freed as FSDP shards the model, before the first step)."""
        phase = {LOADING: 0.0, TRAINING: 0.0}
        other = 0.0
        for key, value in self.host_node.items():
            prefix = key.split(":", 1)[0] + ":"
            if prefix in phase:
                phase[prefix] += value
            else:
                other += value
        return other + max(phase.values())

    @property
    def host_node_steady_bytes(self) -> float:
        """Host RAM per node once training runs: loading copies and first-step transients gone."""
        return sum(v for k, v in self.host_node.items() if not k.startswith((LOADING, FIRST_STEP)))

    def cpu_rank_peak_bytes(self) -> float:
        """A CPU rank's peak RSS: its runtime plus the larger of its loading phase and its training memory.
        While loading, the model is resident about LOAD_RSS_FACTOR times (see there)."""
        runtime = self.device.get("runtime (python, torch, HF stack)", 0.0)
        training = self.device_bytes - runtime
        return runtime + max(training, LOAD_RSS_FACTOR * self.load_per_rank)


def lora_params(cfg: RunConfig, shape: ModelShape) -> int:
    if not cfg.lora.use_peft_lora:
        return 0
    targets = cfg.lora.lora_target_modules
    every = targets == ("all-linear",)
    r = cfg.lora.lora_r
    per_layer = 0
    for lin in shape.layer_linears:
        if every or lin.name.split(".")[-1] in targets:
            per_layer += r * (lin.in_features + lin.out_features) + (lin.out_features if cfg.lora.use_dora else 0)
    return per_layer * shape.n_layers


def base_bytes(cfg: RunConfig, shape: ModelShape) -> tuple[float, float]:
    """(all base weights as FSDP holds them, one decoder layer of them): what FSDP shards and offloads."""
    dtype = DTYPE_BYTES[model_dtype(cfg)]
    if cfg.quantization.use_4bit_quantization:
        layer_linear = sum(lin.in_features * lin.out_features for lin in shape.layer_linears)
        layer = layer_linear * FOUR_BIT_BYTES + (shape.layer_params - layer_linear) * DTYPE_BYTES[quant_storage(cfg)]
        rest = shape.total_params - shape.n_layers * shape.layer_params
        return layer * shape.n_layers + rest * DTYPE_BYTES[quant_storage(cfg)], layer
    return shape.total_params * dtype, shape.layer_params * dtype


def quant_constant_bytes(cfg: RunConfig, shape: ModelShape) -> float:
    """The 4-bit weights' quantization state (absmax, and its second level with nested quantization).

    bitsandbytes keeps it on each Linear4bit module (`module.quant_state`), not as a parameter, so FSDP
    (1 and 2) neither shards nor offloads it: every rank holds all of it on its device."""
    if not cfg.quantization.use_4bit_quantization:
        return 0.0
    const = NESTED_CONST_BYTES if cfg.quantization.use_nested_quant else QUANT_CONST_BYTES
    return shape.linear_params * const


def activation_bytes_per_token(cfg: RunConfig, shape: ModelShape) -> tuple[float, float]:
    """(kept per layer under activation checkpointing, kept per layer without it), per token."""
    act = 2 if compute_precision(cfg) in ("bf16", "fp16", "fp8") else 4
    h, i = shape.hidden_size, shape.intermediate_size
    kv = h * shape.n_kv_heads // shape.n_heads
    # RMSNorm inputs (2h), rotary q/k (h + kv), attention q, k, v, out (2h + 2kv), SwiGLU gate, up, silu, product (4i)
    elements = 6 * h + 3 * kv + 4 * i
    if cfg.lora.use_peft_lora and cfg.lora.lora_dropout > 0:
        elements += 6 * h + i  # each LoRA module keeps its own dropped-out input (q, k, v, o, gate, up: h; down: i)
    full = elements * act
    if cfg.lora.use_peft_lora and cfg.lora.lora_dropout > 0:
        full += 6 * h + i  # dropout masks, one byte per element
    return h * act, full


def estimate(cfg: RunConfig, shape: ModelShape, on_cpu: bool = False) -> Estimate:
    """Every component of one rank's memory, in the order a step meets them (long because it is one
    account: splitting it would scatter the terms that must add up; see the module docstring)."""
    world = max(cfg.launch.num_processes, 1)
    local = cfg.launch.nproc_per_node
    est = Estimate(total_params=shape.total_params)
    n_lora = lora_params(cfg, shape)
    est.trainable_params = n_lora if cfg.lora.use_peft_lora else shape.total_params
    all_base, layer = base_bytes(cfg, shape)
    compute_bytes = 2 if compute_precision(cfg) in ("bf16", "fp16", "fp8") else DTYPE_BYTES[model_dtype(cfg)]
    offload = cfg.fsdp.cpu_offload and not on_cpu

    # weights: this rank's shard, and the full units gathered around it
    shard = all_base / world
    unit = layer if cfg.quantization.use_4bit_quantization else shape.layer_params * compute_bytes
    edge_unit = max(shape.embedding_params, shape.head_params) * compute_bytes  # embedding / lm_head units
    in_flight = PREFETCH_UNITS if cfg.fsdp.reshard_after_forward else shape.n_layers
    gathered = max(unit * in_flight, edge_unit + unit)
    if cfg.fsdp.version == 1:
        # FSDP1's root unit (embeddings, final norm, lm_head: not decoder layers) is not resharded after
        # forward: it stays gathered for the whole step
        root = (shape.embedding_params + shape.head_params + shape.other_params) * compute_bytes
        gathered = unit * in_flight + root
    if world == 1:
        gathered = 0.0  # nothing to gather: the "shard" is the whole model
    # trainable state: LoRA weights + grads + AdamW, sharded (full fine-tuning: every weight)
    if cfg.lora.use_peft_lora:
        train_state = n_lora * (LORA_PARAM_BYTES * 2 + ADAM_BYTES) / world
    else:
        train_state = shape.total_params * (4 + 4 + ADAM_BYTES) / world  # fp32 master, grads, AdamW
        if not cfg.quantization.use_4bit_quantization:
            shard = 0.0  # the fp32 master copy is the weights
    # activations
    tokens = int(cfg.training.get("per_device_train_batch_size") or 8) * cfg.data.max_seq_len
    kept, full_layer = activation_bytes_per_token(cfg, shape)
    checkpointing = cfg.fsdp.activation_checkpointing or gradient_checkpointing(cfg)
    if checkpointing:
        activations = tokens * (kept * shape.n_layers + full_layer)
    else:
        activations = tokens * full_layer * shape.n_layers
    logits = tokens * shape.vocab_size * (compute_bytes + LOSS_BYTES_PER_LOGIT)
    dequant = 0.0
    if cfg.quantization.use_4bit_quantization:
        biggest = max(lin.in_features * lin.out_features for lin in shape.layer_linears)
        dequant = 2 * biggest * DTYPE_BYTES[cfg.quantization.bnb_4bit_compute_dtype]  # weight dequantized for matmul

    dev = est.device
    dev["sharded base weights"] = 0.0 if offload else shard
    consts = quant_constant_bytes(cfg, shape)
    if consts:
        dev["4-bit quantization constants (not sharded)"] = consts
    dev["gathered FSDP units"] = gathered
    dev["trainable params, grads, optimizer"] = 0.0 if offload else train_state
    dev["activations"] = activations
    dev["logits and loss"] = logits
    if dequant:
        dev["4-bit dequantization buffers"] = dequant
    if on_cpu:
        dev["allocator overhead"] = sum(dev.values()) * CPU_ALLOCATOR_OVERHEAD
        dev["runtime (python, torch, HF stack)"] = HOST_RUNTIME_GIB["cpu"] * GiB
    else:
        transient = gathered + activations + logits + dequant
        dev["allocator overhead"] = transient * ALLOCATOR_OVERHEAD
        dev["CUDA context"] = CUDA_CONTEXT_GIB * GiB

    # loading: every local rank reads the checkpoint, or only local rank 0 (cpu_ram_efficient_loading)
    load_dtype = DTYPE_BYTES[model_dtype(cfg)] if not cfg.quantization.use_4bit_quantization else None
    full_model = shape.total_params * load_dtype if load_dtype else all_base + consts
    loaders = 1 if cfg.fsdp.cpu_ram_efficient_loading and world > 1 else local
    est.load_per_rank = full_model  # the worst rank (local rank 0) holds a full copy while loading
    host = est.host_node
    host["runtime (python, torch, HF stack)"] = HOST_RUNTIME_GIB["cpu" if on_cpu else "cuda"] * GiB * local
    host[f"{LOADING} full model copies"] = full_model * loaders
    if offload:
        _offloaded(cfg, shape, est, shard, layer, train_state)
    if on_cpu:
        # the device is the host: training memory of every local rank, after the loading copies are freed
        host[f"{TRAINING} every rank's training memory"] = (
            sum(v for k, v in dev.items() if k != "runtime (python, torch, HF stack)") * local
        )
    return est


def _offloaded(
    cfg: RunConfig, shape: ModelShape, est: Estimate, shard: float, layer: float, train_state: float
) -> None:
    """Host RAM per node under cpu_offload, from what torch's FSDP does with the shards.

    Offloaded shards are pinned, and torch's caching host allocator rounds every pinned block up to a
    power of two. FSDP1 pins one flat parameter per unit and pre-allocates a pinned gradient of the same
    size for every unit, frozen or not (`FlatParamHandle.init_flat_param_attributes`); it does so at the
    first forward while the unpinned shard it offloaded at wrap time lives on until that unit's first
    reshard, so the first step holds three copies. FSDP2 pins each parameter's shard at wrap time and
    offloads gradients only of trainable parameters."""
    world = max(cfg.launch.num_processes, 1)
    local = cfg.launch.nproc_per_node
    host = est.host_node
    if not shard:  # full fine-tuning: the fp32 master weights are the shards; with their grads and AdamW
        host[f"{TRAINING} offloaded fp32 weights, grads, AdamW"] = train_state * local
        est.notes.append("cpu_offload: the fp32 weights, their gradients and AdamW live in host RAM")
        return
    if cfg.fsdp.version == 1:
        units = [layer / world] * shape.n_layers
        units.append((shard * world - layer * shape.n_layers) / world)  # the root unit: embeddings, norm, head
        pinned = sum(_pow2(u) for u in units)
        host[f"{TRAINING} offloaded weight shards (pinned)"] = pinned * local
        host[f"{TRAINING} offloaded grads (pinned, every unit)"] = pinned * local
        host[f"{FIRST_STEP} unpinned shard copies"] = shard * local
    else:
        host[f"{TRAINING} offloaded weight shards (pinned)"] = _pinned_per_param(cfg, shape, world) * local
    host[f"{TRAINING} offloaded trainable state"] = train_state * local
    if cfg.fsdp.version == 1:
        est.notes.append(
            "cpu_offload (FSDP1): pinned weight shards and a pinned gradient buffer for every unit, frozen "
            "ones included; FSDP2 offloads gradients of trainable parameters only"
        )
    else:
        est.notes.append("cpu_offload: sharded weights and trainable state live in host RAM")


def _pinned_per_param(cfg: RunConfig, shape: ModelShape, world: int) -> float:
    """FSDP2: one pinned block per parameter shard."""
    storage = DTYPE_BYTES[quant_storage(cfg)] if cfg.quantization.use_4bit_quantization else None
    per_elem = FOUR_BIT_BYTES if storage else DTYPE_BYTES[model_dtype(cfg)]
    dtype = storage or DTYPE_BYTES[model_dtype(cfg)]
    layer = sum(_pow2(lin.in_features * lin.out_features * per_elem / world) for lin in shape.layer_linears)
    layer_other = shape.layer_params - sum(lin.in_features * lin.out_features for lin in shape.layer_linears)
    rest = shape.total_params - shape.n_layers * shape.layer_params
    # the non-Linear parameters (norms, embeddings, head) are few blocks; rounding them is noise
    return shape.n_layers * layer + (shape.n_layers * layer_other + rest) * dtype / world


def _pow2(size: float) -> float:
    """A pinned block of `size` bytes as torch's caching host allocator allocates it."""
    if size <= 0:
        return 0.0
    block = 1
    while block < size:
        block *= 2
    return float(block)
