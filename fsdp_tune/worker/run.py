"""One rank's run: read the resolved plan, build tokenizer/data/model/trainer, train, save, verify."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from fsdp_tune.config.schema import RunConfig, from_dict
from fsdp_tune.worker_paths import SUMMARY_NAME


class TrainingDiverged(RuntimeError):
    pass


def run(resolved_path: str, started: float | None = None) -> None:
    data = json.loads(Path(resolved_path).read_text())
    cfg: RunConfig = from_dict(data["config"])
    plan = data["plan"]
    output_dir = plan["output_dir"]
    rank = int(os.environ.get("RANK", "0"))

    from fsdp_tune.worker.logs import setup_rank_log

    setup_rank_log(output_dir, rank)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    print(f"fsdp-tune: rank {rank}/{world} starting on {socket.gethostname()} (pid {os.getpid()})", flush=True)
    os.environ["ACCELERATE_USE_FSDP"] = "true"
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = str(cfg.fsdp.cpu_ram_efficient_loading).lower()

    from fsdp_tune.worker import fsdp_wrap

    if plan["on_cpu"]:
        from fsdp_tune.worker import cpu_fsdp

        cpu_fsdp.install()
    fsdp_wrap.install()

    from transformers import set_seed

    from fsdp_tune.worker.callbacks import (
        FaultInjectionCallback,
        MetricsCallback,
        NanGuardCallback,
        StopOnSignalCallback,
    )
    from fsdp_tune.worker.data import load_splits
    from fsdp_tune.worker.model import load_model, load_tokenizer, lora_config
    from fsdp_tune.worker.trainer import sft_config, trainer_class

    started = started or time.time()
    init_process_group(cfg, on_cpu=plan["on_cpu"])
    args = sft_config(cfg, on_cpu=plan["on_cpu"])
    set_seed(args.seed)
    tokenizer = load_tokenizer(cfg)
    with args.main_process_first(desc="dataset preparation"):
        train_ds, eval_ds = load_splits(cfg, tokenizer)
    model = load_model(cfg, tokenizer)
    metrics = MetricsCallback(output_dir)
    nan_guard = NanGuardCallback(check_grad_norm=not args.fp16)
    saves = args.save_strategy != "no"
    stopper = StopOnSignalCallback(output_dir, save=saves and cfg.run.save_on_interrupt)
    callbacks = [metrics, nan_guard, stopper]
    if os.environ.get("FSDP_TUNE_TEST_KILL") or os.environ.get("FSDP_TUNE_TEST_HANG"):
        callbacks.append(FaultInjectionCallback())
    trainer = trainer_class()(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds if args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        peft_config=lora_config(cfg) if cfg.lora.use_peft_lora else None,
        callbacks=callbacks,
    )
    truncation = _report_truncation(trainer, cfg)
    result = trainer.train(resume_from_checkpoint=_resume_point(plan, output_dir))
    if stopper.stopped_at is not None:
        # interrupted: the checkpoint (if any) is the deliverable; the final adapter is for finished runs
        if trainer.is_world_process_zero():
            Path(output_dir, SUMMARY_NAME).write_text(
                json.dumps({"interrupted_at_step": stopper.stopped_at, "checkpoint_saved": stopper.save})
            )
        trainer.accelerator.wait_for_everyone()
        return
    if nan_guard.bad_step is not None:
        raise TrainingDiverged(
            f"loss became NaN/inf at step {nan_guard.bad_step}; training stopped and no adapter was written "
            "over the last good checkpoint (lower --learning_rate, or check the data)"
        )

    from fsdp_tune.worker.save import save_adapter
    from fsdp_tune.worker.verify import verify_adapter

    expected = _adapter_shapes(trainer) if cfg.lora.use_peft_lora else None
    save_adapter(trainer, output_dir)
    summary = _summary(trainer, result, metrics, started, output_dir, cfg)
    summary["truncated_sequences"] = truncation
    summary["vocab_grew"] = _vocab_growth(trainer, tokenizer)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(output_dir)
        trainer.state.save_to_json(str(Path(output_dir) / "trainer_state.json"))
        if cfg.lora.use_peft_lora:
            summary["adapter_check"] = verify_adapter(output_dir, expected)
        Path(output_dir, SUMMARY_NAME).write_text(json.dumps(summary, indent=2))
    trainer.accelerator.wait_for_everyone()


def _report_truncation(trainer, cfg: RunConfig) -> dict | None:
    """Say how much of the data TRL cuts at max_seq_len, which it does without a word."""
    from fsdp_tune.worker.data import truncated_rows

    try:
        cut, total = truncated_rows(trainer.train_dataset, cfg.data.max_seq_len, cfg.data.packing)
    except (TypeError, KeyError, AttributeError):  # an iterable (streamed) dataset: not counted
        return None
    if cut and trainer.is_world_process_zero():
        print(
            f"fsdp-tune: warning: {cut} of {total} training sequences ({cut / total:.0%}) reach max_seq_len "
            f"{cfg.data.max_seq_len} and are cut there; tokens past it are not trained on (raise --max_seq_len "
            "to keep them)",
            flush=True,
        )
    return {"cut": cut, "total": total, "max_seq_len": cfg.data.max_seq_len}


def _vocab_growth(trainer, tokenizer) -> dict | None:
    """Tokens the chat template added: the adapter then carries the embedding layers (see save.py), and
    the base must be resized the same way before the adapter loads onto it."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    grew_from = getattr(base, "fsdp_tune_vocab_grew_from", None)
    if grew_from is None:
        return None
    return {"from": grew_from, "tokenizer": len(tokenizer), "rows": base.get_input_embeddings().weight.shape[0]}


def init_process_group(cfg: RunConfig, on_cpu: bool) -> None:
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
    backend = "gloo" if on_cpu else "nccl"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"fsdp_tune/attempt{attempt}", store),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=int(cfg.training.get("ddp_timeout") or 1800)),
    )


def _resume_point(plan: dict, output_dir: str) -> str | None:
    """The launcher's choice; after an elastic restart (torchrun --max_restarts), the newest complete
    checkpoint of this run, so a restarted attempt continues instead of starting over."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        from fsdp_tune.checkpoints import latest_complete

        best, _ = latest_complete(output_dir)
        if best is not None:
            print(f"fsdp-tune: restart {os.environ['TORCHELASTIC_RESTART_COUNT']}: resuming from {best.path}")
            return str(best.path)
    return plan.get("resume_from_checkpoint")


def _adapter_shapes(trainer) -> dict[str, tuple[int, ...]]:
    """Global shapes of the trainable tensors under their saved names (FSDP2 DTensors report global shapes)."""
    from fsdp_tune.worker.save import saved_name

    model = trainer.model_wrapped or trainer.model
    adapter = trainer.accelerator.unwrap_model(trainer.model).active_adapter
    return {saved_name(n, adapter): tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}


def _summary(trainer, result, metrics, started: float, output_dir: str, cfg: RunConfig) -> dict:
    import torch
    import torch.distributed as dist

    from fsdp_tune.worker.callbacks import peak_rss_mib
    from fsdp_tune.worker.fsdp_wrap import describe_units

    mine = {"peak_rss_mib": round(peak_rss_mib(), 1)}
    if torch.cuda.is_available():
        mine["peak_gpu_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        mine["peak_gpu_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    per_rank = [mine]
    if dist.is_initialized():
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, mine)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    tokens = max((h.get("num_tokens", 0) for h in trainer.state.log_history), default=0)
    runtime = result.metrics.get("train_runtime") or (time.time() - started)
    return {
        "steps": trainer.state.global_step,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "losses": losses,
        "train_runtime_s": runtime,
        "time_to_first_step_s": (metrics.first_step_at - started) if metrics.first_step_at else None,
        "wall_s": time.time() - started,
        "tokens": tokens,
        "tokens_per_s": tokens / runtime if runtime else None,
        "per_rank": per_rank,
        "fsdp_units": describe_units(trainer.model_wrapped or trainer.model),
        "adapter_dir": str(Path(output_dir).resolve()),
        "use_peft_lora": cfg.lora.use_peft_lora,
    }
