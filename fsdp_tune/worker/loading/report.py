"""What loading cost this rank, on whichever path it took (worker/loading/build.py takes the spec's): the path and
why, the model's build time, RSS before the model, when it was ready, and when the first step began (loading,
sharding and the Trainer's preparation all done). The run summary carries every rank's record."""

from __future__ import annotations

import resource
import time
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

# what every rank reports alike; the rest is per rank
SHARED = ("path", "note", "seconds", "tensors_read", "tensors_quantized", "checkpoint_mib")


class LoadReport:
    """This rank's record, filled while the model loads and when the first step begins."""

    def __init__(self, path: str, note: str | None):
        self.started = time.time()
        self.record: dict[str, Any] = {
            "path": path,
            "note": note,
            "rss_before_model_mib": rss_now_mib(),
            "peak_rss_before_model_mib": peak_rss_mib(),
        }

    def update(self, **values: Any) -> None:
        self.record.update(values)

    def model_ready(self) -> None:
        self.update(model_ready_s=round(time.time() - self.started, 2), peak_rss_model_ready_mib=peak_rss_mib())

    def first_step(self, model=None) -> None:
        """The loading phase's peak, on either path: loading, sharding and the Trainer's preparation all done; and
        where the model's parameters then are (the model the Trainer trains)."""
        if "peak_rss_before_first_step_mib" not in self.record:
            self.update(
                peak_rss_before_first_step_mib=peak_rss_mib(),
                model_start_to_first_step_s=round(time.time() - self.started, 2),
                peak_gpu_allocated_before_first_step_mib=peak_gpu_mib(),
                params_mib_by_place=params_by_place(model) if model is not None else None,
            )

    def summary(self) -> dict:
        """The path every rank took and what loading cost each (a collective: all ranks call it)."""
        ranks = [dict(self.record)]
        if dist.is_initialized():
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, dict(self.record))
        out = {k: ranks[0].get(k) for k in SHARED}
        out["per_rank"] = [{k: v for k, v in r.items() if k not in SHARED} for r in ranks]
        return out


class FirstStepMemory(TrainerCallback):
    """Notes this rank's peak RSS in its LoadReport when the first step begins, and where the trained model's
    parameters are: `trained()` gives the model the Trainer trains (wrapped by FSDP1, whose root the callbacks'
    own `model` is not)."""

    def __init__(self, report: LoadReport, trained=None):
        self.report = report
        self.trained = trained

    def on_step_begin(self, args, state, control, **kwargs):
        self.report.first_step((self.trained() if self.trained else None) or kwargs.get("model"))


def params_by_place(model) -> dict[str, float]:
    """MiB of this rank's parameter storage by where it lives: "cuda", "cpu_pinned" (page-locked host memory, where
    cpu_offload keeps FSDP's shards), "cpu", "meta". A DTensor counts its local shard, an FSDP1 flat parameter its
    own storage; a storage several parameters view (tied weights, FSDP1's original parameters) counts once. What
    the rank holds, not what the spec asked for (the GPU check compares the two)."""
    from torch.distributed.tensor import DTensor

    cuda = torch.cuda.is_available()  # is_pinned() asks the accelerator: only where there is one
    out: dict[str, float] = {}
    seen: set[int] = set()
    for p in model.parameters():
        local = (p.to_local() if isinstance(p, DTensor) else p).detach()
        place = local.device.type
        if place == "meta":
            size = local.numel() * local.element_size()
        else:
            storage = local.untyped_storage()
            if storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            size = storage.nbytes()
            if place == "cpu" and cuda and local.is_pinned():
                place = "cpu_pinned"
        out[place] = out.get(place, 0.0) + size / 2**20
    return {k: round(v, 2) for k, v in sorted(out.items())}


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
    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None
