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

    def first_step(self) -> None:
        """The loading phase's peak, on either path: loading, sharding and the Trainer's preparation all done."""
        if "peak_rss_before_first_step_mib" not in self.record:
            self.update(
                peak_rss_before_first_step_mib=peak_rss_mib(),
                model_start_to_first_step_s=round(time.time() - self.started, 2),
                peak_gpu_allocated_before_first_step_mib=peak_gpu_mib(),
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
    """Notes this rank's peak RSS in its LoadReport when the first step begins."""

    def __init__(self, report: LoadReport):
        self.report = report

    def on_step_begin(self, args, state, control, **kwargs):
        self.report.first_step()


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
