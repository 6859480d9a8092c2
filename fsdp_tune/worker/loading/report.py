"""What loading cost this rank, on whichever path it took (worker/sharded_load.py decides which): the path and
why, the model's build time, RSS before the model, when it was ready, and when the first step began (loading,
sharding and the Trainer's preparation all done). The run summary carries every rank's record."""

from __future__ import annotations

import resource
import time

REPORT: dict = {}  # this rank's record, filled while the model loads and the first step begins


def first_step_memory():
    """A TrainerCallback noting this rank's peak RSS when the first step begins: loading, sharding and the
    Trainer's preparation all done (the loading phase's peak, on either path)."""
    from transformers import TrainerCallback

    class FirstStepMemory(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if "peak_rss_before_first_step_mib" not in REPORT:
                REPORT["peak_rss_before_first_step_mib"] = peak_rss_mib()
                REPORT["model_start_to_first_step_s"] = round(time.time() - REPORT.get("started", time.time()), 2)
                REPORT["peak_gpu_allocated_before_first_step_mib"] = peak_gpu_mib()

    return FirstStepMemory()


def loading_summary() -> dict:
    """The path every rank took and what loading cost each (a collective: all ranks call it)."""
    import torch.distributed as dist

    ranks = [dict(REPORT)]
    if dist.is_initialized():
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, dict(REPORT))
    shared = ("path", "note", "seconds", "tensors_read", "tensors_quantized", "checkpoint_mib")
    out = {k: ranks[0].get(k) for k in shared}
    out["per_rank"] = [{k: v for k, v in r.items() if k not in (*shared, "started")} for r in ranks]
    return out


def rss_now_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def peak_rss_mib() -> float:
    """This process's peak RSS so far (Linux reports ru_maxrss in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def peak_gpu_mib() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None
