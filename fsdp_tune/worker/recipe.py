"""One rank's run, as a recipe of named steps (torchtune's recipe shape): setup, tokenizer, data, model,
trainer, train, save, summary. Every decision was made by the launcher and comes in the rank spec; the
steps only execute it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from fsdp_tune import summary as run_summary
from fsdp_tune.launch.spec import RankSpec, from_dict
from fsdp_tune.worker import phases
from fsdp_tune.worker.logs import console


class TrainingDiverged(RuntimeError):
    pass


@dataclass
class Watchers:
    """The callbacks whose state the recipe reads after training."""

    metrics: object
    nan_guard: object
    stopper: object


def run(resolved_path: str, started: float | None = None) -> None:
    started = started or time.time()
    spec = read_spec(resolved_path)
    setup(spec)
    tokenizer = build_tokenizer(spec)
    args = training_args(spec)
    with args.main_process_first(desc="dataset preparation"):
        train_ds, eval_ds, data_report = build_data(spec, tokenizer)
    model, args = build_model(spec, tokenizer, args)
    trainer, watch = build_trainer(spec, args, model, tokenizer, train_ds, eval_ds)
    truncation = report_truncation(trainer, spec)
    result = train(trainer, spec)
    if watch.stopper.stopped_at is not None:
        finish_interrupted(trainer, spec, watch.stopper)
        return
    check_finite(watch.nan_guard)
    summary = save_and_verify(trainer, spec, tokenizer)
    push(trainer, spec)
    write_summary(trainer, spec, result, watch, started, truncation, summary, data_report)


def read_spec(resolved_path: str) -> RankSpec:
    return from_dict(json.loads(Path(resolved_path).read_text())["spec"])


def setup(spec: RankSpec) -> int:
    """Rank log, environment, the CPU shim (when the spec asks), test hooks, the Hub client, process group."""
    from fsdp_tune.worker import faults
    from fsdp_tune.worker.logs import setup_rank_log
    from fsdp_tune.worker.saving import hub

    os.environ.update(spec.env)  # inherited from the launcher already; a spec run by hand gets it too
    rank = int(os.environ.get("RANK", "0"))
    setup_rank_log(spec.output_dir, rank, spec.console)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    print(f"fsdp-tune: rank {rank}/{world} starting on {socket.gethostname()} (pid {os.getpid()})", flush=True)
    if spec.cpu_fsdp_shim:
        from fsdp_tune.worker import cpu_fsdp

        cpu_fsdp.install()
    faults.install_fake_hub()  # test-only; nothing unless FSDP_TUNE_TEST_FAKE_HUB is set
    hub.exclude_bookkeeping()
    init_process_group(spec)
    return rank


def init_process_group(spec: RankSpec) -> None:
    """Join the process group under a key prefix of its own per torchrun attempt.

    With torchrun's agent-hosted store, an elastic restart finds the previous attempt's gloo/NCCL
    addresses still in the store, and the new ranks try to connect to dead peers ("Gloo connectFullMesh
    failed ... Connection refused"). accelerate/Trainer then find the group initialised and use it.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    store, rank, world = next(dist.rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if spec.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        spec.backend,
        store=dist.PrefixStore(f"fsdp_tune/attempt{attempt}", store),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=spec.timeout_s),
    )


def build_tokenizer(spec: RankSpec):
    from fsdp_tune.worker.loading.pretrained import load_tokenizer

    return load_tokenizer(spec)


def training_args(spec: RankSpec):
    from transformers import set_seed

    from fsdp_tune.worker.training.trainer import sft_config

    args = sft_config(spec)
    set_seed(args.seed)
    return args


@phases.timed("build_data", show=phases.data_read)
def build_data(spec: RankSpec, tokenizer):
    from fsdp_tune.worker.data.lengths import load_splits

    return load_splits(spec, tokenizer)


@phases.timed("build_model", show=phases.model_loaded)
def build_model(spec: RankSpec, tokenizer, args):
    """The model on the spec's loading path (worker/sharded_load.py), and the SFTConfig that trains it (its own
    when a rank finds that sharded loading cannot take this model and falls back)."""
    from fsdp_tune.worker.loading.sharded import build

    return build(spec, tokenizer, args)


@phases.timed("build_trainer", show=phases.data_prepared)
def build_trainer(spec: RankSpec, args, model, tokenizer, train_ds, eval_ds):
    from fsdp_tune.worker import faults
    from fsdp_tune.worker.loading.pretrained import lora_config
    from fsdp_tune.worker.loading.report import first_step_memory
    from fsdp_tune.worker.loading.sharded import prebuilt
    from fsdp_tune.worker.training.callbacks import (
        MetricsCallback,
        NanGuardCallback,
        ShardingCheckCallback,
        StopOnSignalCallback,
    )
    from fsdp_tune.worker.training.progress import ProgressCallback
    from fsdp_tune.worker.training.trainer import trainer_class

    watch = Watchers(
        metrics=MetricsCallback(spec.output_dir),
        nan_guard=NanGuardCallback(check_grad_norm=spec.check_grad_norm),
        stopper=StopOnSignalCallback(spec.output_dir, save=spec.checkpoint_on_stop, device=spec.device),
    )
    sharding = ShardingCheckCallback(spec.world.world_size, spec.unit_fsdp_config["auto_wrap_policy"])
    progress = ProgressCallback(spec.device, spec.world.world_size, phases.started("rank"), spec.console == "live")
    trainer = trainer_class()(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds if args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        peft_config=None if prebuilt(model) else lora_config(spec),  # sharded loading applied LoRA already
        callbacks=[
            *(watch.metrics, watch.nan_guard, watch.stopper, sharding, progress, first_step_memory()),
            *faults.callbacks(),
        ],
    )
    return trainer, watch


def report_truncation(trainer, spec: RankSpec) -> dict | None:
    """Say how much of the data TRL cuts at max_seq_len, which it does without a word."""
    from fsdp_tune.worker.data.lengths import truncated_rows

    max_len = spec.data.max_seq_len
    try:
        cut, total = truncated_rows(trainer.train_dataset, max_len, spec.data.packing)
    except (TypeError, KeyError, AttributeError):  # an iterable (streamed) dataset: not counted
        return None
    if cut and trainer.is_world_process_zero():
        console().line(
            f"warning: {cut} of {total} training sequences ({cut / total:.0%}) reach max_seq_len "
            f"{max_len} and are cut there; tokens past it are not trained on (raise --max_seq_len to keep them)"
        )
    return {"cut": cut, "total": total, "max_seq_len": max_len}


@phases.timed("train")
def train(trainer, spec: RankSpec):
    return trainer.train(resume_from_checkpoint=resume_point(spec))


def resume_point(spec: RankSpec) -> str | None:
    """The launcher's choice; after an elastic restart (torchrun --max_restarts), the newest complete
    checkpoint of this run, so a restarted attempt continues instead of starting over."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        from fsdp_tune.launch.checkpoints import latest_complete

        best, _ = latest_complete(spec.output_dir)
        if best is not None:
            console().line(f"restart {os.environ['TORCHELASTIC_RESTART_COUNT']}: resuming from {best.path}")
            return str(best.path)
    return spec.resume_from_checkpoint


def finish_interrupted(trainer, spec: RankSpec, stopper) -> None:
    """Interrupted: the checkpoint (if any) is the deliverable; the final adapter is for finished runs."""
    if trainer.is_world_process_zero():
        run_summary.write(spec.output_dir, run_summary.Interrupted(stopper.stopped_at, stopper.save, stopper.signal))
    trainer.accelerator.wait_for_everyone()


def check_finite(nan_guard) -> None:
    if nan_guard.bad_step is not None:
        raise TrainingDiverged(
            f"loss became NaN/inf at step {nan_guard.bad_step}; training stopped and no adapter was written "
            "over the last good checkpoint (lower --learning_rate, or check the data)"
        )


@phases.timed("save_and_verify", show=phases.saved)
def save_and_verify(trainer, spec: RankSpec, tokenizer) -> dict:
    """The final adapter (all ranks gather, rank 0 writes), the tokenizer and trainer state; rank 0 re-opens
    the adapter and proves it whole and trained. Returns what the summary records about it."""
    from fsdp_tune.worker.saving.save import save_adapter
    from fsdp_tune.worker.saving.verify import expected_adapter, verify_adapter
    from fsdp_tune.worker.summary import vocab_growth

    expected = expected_adapter(trainer) if spec.lora is not None else (None, None)
    save_adapter(trainer, spec.output_dir)
    out = {"vocab_grew": vocab_growth(trainer, tokenizer), "adapter_check": None}
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(spec.output_dir)
        trainer.state.save_to_json(str(Path(spec.output_dir) / "trainer_state.json"))
        if spec.lora is not None:
            out["adapter_check"] = verify_adapter(spec.output_dir, *expected)
    return out


def push(trainer, spec: RankSpec) -> None:
    """--push_to_hub: the adapter just saved and verified, from rank 0 (see worker/hub.py)."""
    if trainer.args.push_to_hub:
        from fsdp_tune.worker.saving.hub import push_final

        push_final(trainer, spec.output_dir)
    trainer.accelerator.wait_for_everyone()


def write_summary(
    trainer, spec: RankSpec, result, watch: Watchers, started: float, truncation, saved: dict, data: dict
) -> None:
    from fsdp_tune.worker.loading.report import loading_summary
    from fsdp_tune.worker.summary import collect

    extra = {"loading": loading_summary()}  # a collective, as collect is
    summary = collect(
        trainer, spec, result, watch.metrics, started, truncated_sequences=truncation, data=data, extra=extra, **saved
    )
    if trainer.is_world_process_zero():
        run_summary.write(spec.output_dir, summary)
    trainer.accelerator.wait_for_everyone()
