"""The run summary's numbers, read off the trained model and the Trainer's state (all ranks take part)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from fsdp_tune.config.methods import metric_keys, row_of
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.summary import RankMemory, RunSummary
from fsdp_tune.worker.loading.report import peak_gpu_mib, peak_rss_mib
from fsdp_tune.worker.wrappers import base, describe_units, outer


def collect(trainer, spec: RankSpec, result, metrics, started: float, **extra) -> RunSummary:
    """A collective (every rank's peak memory is gathered): all ranks call it."""
    mine = RankMemory(peak_rss_mib=peak_rss_mib())
    if torch.cuda.is_available():
        mine = RankMemory(
            peak_rss_mib=mine.peak_rss_mib,
            peak_gpu_allocated_mib=peak_gpu_mib(),
            peak_gpu_reserved_mib=round(torch.cuda.max_memory_reserved() / 2**20, 1),
        )
    per_rank = [mine]
    if dist.is_initialized():
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, mine)
    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    tokens = max((h.get("num_tokens", 0) for h in history), default=0)
    runtime = result.metrics.get("train_runtime") or (time.time() - started)
    model = outer(trainer)
    return RunSummary(
        steps=trainer.state.global_step,
        loss_first=losses[0] if losses else None,
        loss_last=losses[-1] if losses else None,
        losses=losses,
        train_runtime_s=runtime,
        time_to_first_step_s=(metrics.first_step_at - started) if metrics.first_step_at else None,
        wall_s=time.time() - started,
        tokens=tokens,
        tokens_per_s=tokens / runtime if runtime else None,
        per_rank=per_rank,
        fsdp_units=describe_units(model),
        adapter_dir=str(Path(spec.output_dir).resolve()),
        use_peft_lora=spec.lora is not None,
        mesh=mesh_of(model),
        trackers=tracker_locations(trainer) or None,
        method=spec.method.name,
        method_metrics=method_metrics(history, spec.method.name),
        **extra,
    )


def method_metrics(history: list[dict], method: str) -> dict[str, dict[str, float]] | None:
    """The method's own training metrics (DPO's reward accuracy and margins, KTO's KL, ...): first and last logged."""
    out = {}
    logged = {k for h in history if "eval_loss" not in h for k in h}
    for key, _ in metric_keys(row_of(method), logged):
        values = [h[key] for h in history if key in h and "eval_loss" not in h]
        if values:
            out[key] = {"first": float(values[0]), "last": float(values[-1])}
    return out or None


def tracker_locations(trainer) -> dict[str, str]:
    """Where each --report_to tracker put the run, read off transformers' own callbacks: TensorBoard's event
    folder, wandb's run page (or its local folder offline), mlflow's tracking URI and experiment."""
    import os

    found = {}
    for callback in trainer.callback_handler.callbacks:
        kind = type(callback).__name__
        if kind == "TensorBoardCallback" and getattr(callback, "logging_dir", None):
            found["tensorboard"] = os.path.abspath(callback.logging_dir)
        elif kind == "WandbCallback":
            run = getattr(getattr(callback, "_wandb", None), "run", None)
            url = getattr(run, "url", None) if run is not None else None
            where = url or (getattr(run, "dir", None) if run is not None else None)
            found["wandb"] = str(where or os.path.abspath(os.environ.get("WANDB_DIR", "wandb")))
        elif kind == "MLflowCallback":
            flow = getattr(callback, "_ml_flow", None)
            uri = flow.get_tracking_uri() if flow is not None else os.environ.get("MLFLOW_TRACKING_URI", "mlruns")
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME")
            found["mlflow"] = str(uri) + (f" (experiment {experiment})" if experiment else "")
    return found


def vocab_growth(model, grew_from: int | None, tokenizer) -> dict | None:
    """Tokens the chat template added (`grew_from`: the model step's Loaded.vocab_grew_from): the adapter then
    carries the embedding layers (saving/save.py), and the base must be resized the same way before the adapter
    loads onto it."""
    if grew_from is None:
        return None
    rows = base(model).get_input_embeddings().weight.shape[0]
    return {"from": grew_from, "tokenizer": len(tokenizer), "rows": rows}


def mesh_of(model) -> dict[str, int] | None:
    """The device mesh the trained parameters live on, read off the model itself (dim name -> size), so a
    mesh setting that was dropped on the way cannot hide: None when no parameter is a DTensor (FSDP1)."""
    for param in model.parameters():
        if isinstance(param, DTensor):
            m = param.device_mesh
            names = m.mesh_dim_names or tuple(f"dim{i}" for i in range(m.ndim))
            return dict(zip(names, (int(n) for n in m.shape), strict=True))
    return None
