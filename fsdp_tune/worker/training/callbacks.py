"""Trainer callbacks: metrics.jsonl, a NaN guard, stop-on-signal, and the sharding self-check."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from fsdp_tune.rundir.checkpoints import BATCH_KEYS, write_marker
from fsdp_tune.runfiles import ADAPTER_CONFIG, METRICS_NAME, STOP_FILE, open_nofollow
from fsdp_tune.worker.loading.report import peak_rss_mib
from fsdp_tune.worker.rank import is_main
from fsdp_tune.worker.training import signals
from fsdp_tune.worker.wrappers import describe_units


def mark_complete(output_dir: str, step: int, run_id: str | None, args=None) -> None:
    """Called on rank 0 once every rank has written every file of checkpoint-`step` (before old ones are
    rotated): the marker lists them with sizes and hashes, names the run and, given the TrainingArguments,
    the global batch (a resume on another number of ranks is told what changes; rundir/checkpoints.py)."""
    folder = Path(output_dir) / f"checkpoint-{step}"
    batch = {k: int(getattr(args, k)) for k in BATCH_KEYS} if args is not None else None
    if folder.is_dir():
        write_marker(folder, step, run_id, batch)


def record_adapter_config(model, output_dir: str, step: int) -> None:
    """Rank 0, before the marker: PEFT's adapter_config.json in checkpoint-`step` (a sharded checkpoint has none
    of its own), so a resume can be checked against the adapter it continues (preflight/resume.py) before any rank
    starts, and the marker lists it with the other files."""
    folder = Path(output_dir) / f"checkpoint-{step}"
    configs = getattr(model, "peft_config", None)
    if not folder.is_dir() or (folder / ADAPTER_CONFIG).exists() or not isinstance(configs, dict) or not configs:
        return
    configs[getattr(model, "active_adapter", "default")].save_pretrained(str(folder))


class MetricsCallback(TrainerCallback):
    """One line per logging step in OUTPUT_DIR/metrics.jsonl (rank 0), and the numbers for the summary."""

    def __init__(self, output_dir: str, run_id: str | None):
        self.output_dir = output_dir
        self.path = Path(output_dir) / METRICS_NAME
        self.run_id = run_id
        self.first_step_at: float | None = None
        self.started_at = time.time()

    def on_step_end(self, args, state, control, **kwargs):
        if self.first_step_at is None:
            self.first_step_at = time.time()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not is_main() or not logs:
            return
        record = {
            "step": state.global_step,
            "epoch": state.epoch,
            "time": round(time.time() - self.started_at, 3),
            "peak_rss_mib": peak_rss_mib(),
            "run_id": self.run_id,
            **logs,
        }
        with os.fdopen(open_nofollow(self.output_dir, METRICS_NAME), "a") as f:
            f.write(json.dumps(record) + "\n")


class NanGuardCallback(TrainerCallback):
    """Stop on a NaN/inf loss or gradient norm instead of training on garbage; no checkpoint is written
    over the last good one. (Trainer's logging_nan_inf_filter would log such a loss as a plausible
    number; fsdp-tune turns that filter off outside fp16, where a scaler-skipped step is routine.)"""

    def __init__(self, check_grad_norm: bool):
        self.check_grad_norm = check_grad_norm
        self.bad_step: int | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        values = [logs.get("loss")] + ([logs.get("grad_norm")] if self.check_grad_norm else [])
        if any(v is not None and not math.isfinite(float(v)) for v in values):
            self.bad_step = state.global_step
            control.should_training_stop = True
            control.should_save = False


class StopOnSignalCallback(TrainerCallback):
    """Preemption and Ctrl-C: finish the current step, save a checkpoint, stop.

    The launcher asks by writing OUTPUT_DIR/STOP_FILE (torchrun runs in its own session, so a terminal's
    Ctrl-C reaches only the launcher); a signal to a rank directly (a scheduler preempting the job) asks the
    same (training/signals.py counts repeats as one). Ranks agree through an all-reduce at each step end, of the
    signal number, so all of them stop at the same step, the checkpoint's collectives line up, and rank 0
    knows what asked.
    """

    def __init__(self, output_dir: str, save: bool, device: str):
        self.stop_file = Path(output_dir) / STOP_FILE
        self.device = device
        self.save = save
        self.request = signals.current().install()  # again: a library loaded since may have replaced it
        self.stopped_at: int | None = None
        self.signal: int | None = None

    def on_step_end(self, args, state, control, **kwargs):
        local = self.request.signum or (self._stop_file_signal() if self.stop_file.exists() else 0)
        if dist.is_initialized():
            flag = torch.tensor([local], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            local = int(flag.item())
        if local:
            self.stopped_at = state.global_step
            self.signal = local
            control.should_training_stop = True
            control.should_save = self.save

    def _stop_file_signal(self) -> int:
        """The signal the launcher received (it writes the number), or SIGTERM's."""
        try:
            return int(self.stop_file.read_text().strip() or 15)
        except (OSError, ValueError):
            return 15


class ShardingCheckCallback(TrainerCallback):
    """torchtune's shard_model self-check: with more than one rank, a model wrapped as one FSDP unit has every
    rank gather all of it at once, so sharding saves nothing. Checked once the Trainer has wrapped the model
    (on_train_begin comes after accelerator.prepare), and fatal: a silent whole-model unit is the costly kind."""

    def __init__(self, world_size: int, wrap_policy: str):
        self.active = world_size > 1 and wrap_policy != "NO_WRAP"

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not self.active or model is None:
            return
        units = describe_units(model)
        if sum(units.values()) <= 1:
            raise RuntimeError(
                f"FSDP wrapped the model as {sum(units.values())} unit(s) ({units or 'none'}): every rank would gather "
                "the whole model at once, so sharding saves no memory. Name the decoder layer class with "
                "fsdp_transformer_layer_cls_to_wrap, or use SIZE_BASED_WRAP with min_num_params"
            )
