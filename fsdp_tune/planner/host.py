"""Host RAM: the loading phase (per loading path), CPU offload's pinned shards, and a CPU rank's RSS.

Components are keyed with a phase prefix: the loading copies are freed as FSDP shards the model, before
the first step, so a node's peak is its runtime plus the larger of the loading and the training phase.
"""

from __future__ import annotations

GiB = 2**30
# A rank's process with torch and the HF stack imported. cpu: measured on this machine (tiny model, 2 CPU
# ranks, RSS before loading); cuda: the CUDA runtime and its libraries mapped in, an assumption (no GPU here).
HOST_RUNTIME_GIB = {"cuda": 3.0, "cpu": 0.53}
# While loading on CPU, RSS holds the model about LOAD_RSS_FACTOR times: the tensors from_pretrained
# materialises, the memory-mapped checkpoint pages it copies from (RSS counts them once faulted in, though
# the kernel can reclaim them), and a transient copy as fully_shard replaces parameters with shards.
# Measured on this machine with transformers 5.24 on a 125M-parameter Llama (2 ranks, 0.46 GiB in fp32,
# 0.53 GiB runtime): 1.52 to 1.95 GiB peak per rank across runs, i.e. 2.1 to 3.1 model copies; the planner
# takes the middle. A constant from a measurement here, named, and checked by tests/dist/test_plan.py.
LOAD_RSS_FACTOR = 2.5
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


def cpu_rank_peak(device: dict[str, float], load_per_rank: float) -> float:
    """A CPU rank's peak RSS: its runtime plus the larger of its loading phase and its training memory."""
    runtime = device.get(RUNTIME, 0.0)
    training = sum(device.values()) - runtime
    return runtime + max(training, LOAD_RSS_FACTOR * load_per_rank)


def loading_per_rank(loading: str, full_model: float, shard: float, layer: float) -> float:
    """Host bytes one rank holds while loading. transformers 5.24's from_pretrained: a full copy on every
    local rank (ranks > 0 too, cpu_ram_efficient_loading or not). sharded: the rank's own shards plus one
    layer in flight (read from safetensors, quantized if it is 4-bit, then kept or dropped)."""
    return full_model if loading == "transformers" else shard + layer


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
