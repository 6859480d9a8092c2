"""Host RAM: the loading phase (per loading path), CPU offload's pinned shards, and a CPU rank's RSS.

Components are keyed with a phase prefix: the loading copies are freed as FSDP shards the model, before
the first step, so a node's peak is its runtime plus the larger of the loading and the training phase.
"""

from __future__ import annotations

GiB = 2**30
# A rank's process with torch and the HF stack imported. cpu: measured on this machine (tiny model, 2 CPU
# ranks, RSS before loading); cuda: the CUDA runtime and its libraries mapped in, an assumption (no GPU here).
HOST_RUNTIME_GIB = {"cuda": 3.0, "cpu": 0.53}
# A CPU rank's RSS when its first step begins (loading, sharding and the Trainer's preparation done), above its
# RSS before the model, as a multiple of loading_per_rank(); measured on this machine (benchmarks/loading.py,
# BENCHMARKS.md section 8): transformers 5.24's from_pretrained, 1.06-1.09 x the fp32 checkpoint at 443M and
# 1.15-1.22 x at 125M (the memory-mapped checkpoint pages count in RSS, and fully_shard's copies come on top;
# QLoRA 1.4-1.6 x, the fp32 checkpoint and the 4-bit copy it quantizes into); sharded loading, 1.08 (LoRA) to
# 1.2 (QLoRA: its replicated quant state and the adapters, whole until fully_shard) x the shard and one layer.
LOAD_RSS_FACTORS = {"transformers": 1.2, "sharded": 1.15}
# On CPU the step's freed buffers (all-gathered units, activations, logits) stay in glibc's heap: its mmap
# threshold rises to the largest buffer freed, so the next ones come from the heap and its freed pages stay in
# RSS. A whole CPU run's peak above the runtime was 1.2-1.6 x the planned allocated step memory on the 125M
# Llama (micro-batch 4 x 128) and 1.9-2.4 x on the 443M one (1 x 64), alike on both loading paths; the planner
# takes 1.5 for the step's transient part (the static shards, trainable state are not freed). Measured here,
# named, checked by tests/lib/test_plan.py; MALLOC_MMAP_THRESHOLD_=65536 returns those pages (BENCHMARKS.md 8).
CPU_HEAP_RETENTION = 1.5
LOADING, TRAINING = "loading:", "training:"
FIRST_STEP = f"{TRAINING} first step:"  # training-phase memory that is freed during the first step
RUNTIME = "runtime (python, torch, HF stack)"


def node_peak(components: dict[str, float]) -> float:
    """Peak host RAM per node: the runtime, plus the larger of the loading and the training phase."""
    phase = {LOADING: 0.0, TRAINING: 0.0}
    other = 0.0
    for key, value in components.items():
        prefix = key.split(":", 1)[0] + ":"
        if prefix in phase:
            phase[prefix] += value
        else:
            other += value
    return other + max(phase.values())


def node_steady(components: dict[str, float]) -> float:
    """Host RAM per node once training runs: loading copies and first-step transients gone."""
    return sum(v for k, v in components.items() if not k.startswith((LOADING, FIRST_STEP)))


def cpu_rank_peak(device: dict[str, float], load_per_rank: float, loading: str, static: float) -> float:
    """A CPU rank's peak RSS: its runtime plus the larger of its loading phase and its training memory (the
    step's transients as glibc's heap keeps them)."""
    runtime = device.get(RUNTIME, 0.0)
    training = static + CPU_HEAP_RETENTION * (sum(device.values()) - runtime - static)
    return runtime + max(training, LOAD_RSS_FACTORS[loading] * load_per_rank)


def loading_per_rank(
    loading: str, full_model: float, shard: float, layer: float, shards_on_host: bool, adapters: float = 0.0
) -> float:
    """Host bytes one rank holds while loading. transformers 5.24's from_pretrained: a full copy on every
    local rank (ranks > 0 too, cpu_ram_efficient_loading or not). sharded: at most one layer in flight (read
    from safetensors, quantized if it is 4-bit, then kept or dropped), the new LoRA adapters whole until
    fully_shard shards them, and the rank's own shards where they live on the host (a CPU run, or cpu_offload;
    on a GPU they go to the GPU)."""
    if loading == "transformers":
        return full_model
    return layer + adapters + (shard if shards_on_host else 0.0)


def offloaded(fsdp_version: int, shard_units: list[float], pinned_fsdp2: float, shard: float, local: int) -> dict:
    """Host RAM per node under cpu_offload, from what torch's FSDP does with the shards.

    Offloaded shards are pinned, and torch's caching host allocator rounds every pinned block up to a
    power of two. FSDP1 pins one flat parameter per unit and pre-allocates a pinned gradient of the same
    size for every unit, frozen or not (`FlatParamHandle.init_flat_param_attributes`); it does so at the
    first forward while the unpinned shard it offloaded at wrap time lives on until that unit's first
    reshard, so the first step holds three copies. FSDP2 pins each parameter's shard at wrap time and
    offloads gradients only of trainable parameters."""
    if fsdp_version == 1:
        pinned = sum(pow2(u) for u in shard_units)
        return {
            f"{TRAINING} offloaded weight shards (pinned)": pinned * local,
            f"{TRAINING} offloaded grads (pinned, every unit)": pinned * local,
            f"{FIRST_STEP} unpinned shard copies": shard * local,
        }
    return {f"{TRAINING} offloaded weight shards (pinned)": pinned_fsdp2 * local}


def pow2(size: float) -> float:
    """A pinned block of `size` bytes as torch's caching host allocator allocates it."""
    if size <= 0:
        return 0.0
    block = 1
    while block < size:
        block *= 2
    return float(block)
