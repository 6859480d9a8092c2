"""Trainer callbacks: metrics.jsonl, completion markers on checkpoints, a NaN guard."""

from __future__ import annotations

import json
import math
import resource
import time
from pathlib import Path

from transformers import TrainerCallback

from fsdp_tune.worker_paths import COMPLETE_MARKER


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class MetricsCallback(TrainerCallback):
    """One line per logging step in OUTPUT_DIR/metrics.jsonl (rank 0), and the numbers for the summary."""

    def __init__(self, output_dir: str):
        self.path = Path(output_dir) / "metrics.jsonl"
        self.first_step_at: float | None = None
        self.started_at = time.time()

    def on_step_end(self, args, state, control, **kwargs):
        if self.first_step_at is None:
            self.first_step_at = time.time()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {
            "step": state.global_step,
            "epoch": state.epoch,
            "time": round(time.time() - self.started_at, 3),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            **logs,
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


class CheckpointMarkerCallback(TrainerCallback):
    """Write a marker into each checkpoint once Trainer has finished writing it (on_save runs after
    model, optimizer, scheduler, RNG and trainer state): `--resume_from_checkpoint latest` trusts only
    checkpoints that have it."""

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                (folder / COMPLETE_MARKER).write_text(json.dumps({"global_step": state.global_step}))


class NanGuardCallback(TrainerCallback):
    """Stop on a NaN/inf loss instead of training on garbage; the last checkpoint stays as it was."""

    def __init__(self):
        self.bad_step: int | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.bad_step = state.global_step
            control.should_training_stop = True
            control.should_save = False
