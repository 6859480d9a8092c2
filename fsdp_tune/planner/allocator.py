"""From peak allocated to what a GPU shows: the caching allocator's reserve and the CUDA context, as a range.

What the formula (planner/memory.py) predicts is peak *allocated*: live tensors, the number
torch.cuda.max_memory_allocated reports. PyTorch's caching allocator reserves more (max_memory_reserved):
  - blocks cached in another stream's pool: FSDP all-gathers into buffers of its own stream, which the
    compute stream cannot reuse; that pool keeps two units' worth (derived: Estimate.stream_pool);
  - rounding: every block to 512 B, segments of large blocks to 2 MiB (well under 1% for these tensors:
    not counted);
  - blocks freed in one phase and kept for the next, when the peak phase cannot reuse them (fragmentation):
    not derivable from the code. Its bound, with no reuse across phases at all, is the largest set of
    transients that another phase frees before the peak (the upper end of the range).
nvidia-smi adds memory outside the allocator: the CUDA context with its loaded kernels and NCCL's buffers.
CUDA_CONTEXT_GIB is a stated assumption (no GPU was lent to measure it; `torch.cuda.mem_get_info` before and
after init on the run would), not a fitted value.

Under memory pressure the allocator frees its cache and retries before it fails, so what must fit is the
allocated peak plus the context: `fits` is judged on that; the range's upper end says whether the run will
sit at the card's capacity.
"""

from __future__ import annotations

from fsdp_tune.planner.memory import STATIC_KEYS, Estimate, GiB
from fsdp_tune.planner.stack import Stack

CUDA_CONTEXT_GIB = (0.5, 1.0)  # CUDA context + NCCL buffers: low (few ranks, lazy module loading) .. high


def device_memory(est: Estimate, budget_gib: float) -> dict:
    """The plan's device figures: allocated, the point (reserved + context) and the range, and the verdict."""
    allocated = est.device_bytes / GiB
    training = sum(est.device.values()) / GiB
    loading_peak = est.gpu_loading / GiB > training
    pool = 0.0 if loading_peak else est.stream_pool / GiB
    others = [v for k, v in est.phases.items() if k != est.peak_phase]
    cached = max((v - _static(est) for v in others), default=0.0) / GiB if not loading_peak else 0.0
    low_ctx, high_ctx = CUDA_CONTEXT_GIB
    # the cache the peak phase cannot reuse lies between none (perfect reuse) and `cached` (no reuse across
    # phases); the point takes the middle of that interval, a choice stated in `assumptions`, not a fit
    reserved = allocated + pool + cached / 2
    point = reserved + (low_ctx + high_ctx) / 2
    low = allocated + low_ctx
    high = allocated + pool + cached + high_ctx
    return {
        "peak_allocated_gib": round(allocated, 2),
        "training_peak_gib": round(training, 2),
        "peak_phase": "loading (before FSDP shards the model)" if loading_peak else est.peak_phase,
        "peak_reserved_gib": round(reserved, 2),
        "per_gpu_memory_gib": round(point, 2),
        "range_gib": [round(low, 2), round(high, 2)],
        "gpu_memory_gib": round(budget_gib, 1),
        "fits": low <= budget_gib,
        "at_capacity": high > budget_gib >= low,
    }


def _static(est: Estimate) -> float:
    return sum(v for k, v in est.device.items() if k in STATIC_KEYS)


def assumptions(st: Stack, loading: str, on_cpu: bool) -> list[str]:
    """What the plan assumed that a run could change: say it, so a reader can tell why a measurement differs."""
    if on_cpu:
        return [
            "host RSS per rank: the larger of the loading phase (transformers: ~1.2 x the checkpoint; sharded: ~1.15 x "
            "the rank's shards and one layer) and training memory with the step's transients x1.5 (glibc's heap keeps "
            "freed buffers), plus the runtime (0.53 GiB); each factor measured here",
            f"loading: {loading}",
        ]
    loss = "TRL's chunked fused LM head (no full logits)" if st.loss == "trl_fused" else f"full logits ({st.loss})"
    return [
        "predicts peak allocated (torch.cuda.max_memory_allocated); reserved adds FSDP's all-gather stream cache and "
        "half of what another phase leaves cached (the range's top: all of it, no reuse across phases); the point "
        f"adds {sum(CUDA_CONTEXT_GIB) / 2:.2f} GiB CUDA context + NCCL (assumed {CUDA_CONTEXT_GIB[0]}-"
        f"{CUDA_CONTEXT_GIB[1]} GiB); fits: allocated + context within the card (the allocator frees its cache "
        "before it fails)",
        f"attention: {st.attention} ({'s^2 probabilities per head' if st.attention == 'eager' else 'no s^2 term'})",
        f"loss: {loss}",
        f"activation checkpointing: {st.checkpointing}; FSDP{st.fsdp_version}; loading: {loading}",
        "bitsandbytes >= 0.44 (4-bit matmul saves no input; one dequantized weight at a time)",
    ]
