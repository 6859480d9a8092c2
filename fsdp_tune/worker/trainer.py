"""SFTConfig from the resolved config, and the SFTTrainer subclass that saves correctly under FSDP."""

from __future__ import annotations

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.resolve import fsdp_config, gradient_checkpointing
from fsdp_tune.rules.quant import compute_precision


def sft_config(cfg: RunConfig, on_cpu: bool):
    from trl import SFTConfig

    args = dict(cfg.training.args)
    precision = compute_precision(cfg)
    args.update(
        fsdp=True,
        fsdp_config=fsdp_config(cfg, on_cpu),
        bf16=precision in ("bf16", "fp8"),
        fp16=precision == "fp16",
        use_cpu=on_cpu,
        max_length=cfg.data.max_seq_len,
        packing=cfg.data.packing,
        dataset_text_field=cfg.data.dataset_text_field,
        # transformers 5 renamed the Trainer's gradient_checkpointing to activation_checkpointing
        activation_checkpointing=gradient_checkpointing(cfg),
    )
    args.pop("gradient_checkpointing", None)
    kwargs = args.pop("gradient_checkpointing_kwargs", None) or {}
    args.pop("resume_from_checkpoint", None)  # resolved by the launcher and passed to train()
    if args["activation_checkpointing"]:
        args["activation_checkpointing_kwargs"] = {"use_reentrant": cfg.run.use_reentrant, **kwargs}
    if on_cpu:
        args["ddp_backend"] = "gloo"
    if not args["fp16"]:
        args.setdefault("logging_nan_inf_filter", False)  # a NaN must show as NaN (see NanGuardCallback)
    args.setdefault("report_to", "none")
    for key in ("report_to",):
        if isinstance(args.get(key), tuple):
            args[key] = list(args[key])
    return SFTConfig(**args)


def trainer_class():
    import os

    from transformers.trainer import rotate_checkpoints
    from trl import SFTTrainer

    from fsdp_tune.worker.callbacks import mark_complete
    from fsdp_tune.worker.save import load_adapter_into_fsdp, save_adapter

    # Test-only fault injection: FSDP_TUNE_TEST_POISON_STEP=N makes the loss of step N NaN.
    poison = os.environ.get("FSDP_TUNE_TEST_POISON_STEP")
    poison_step = int(poison) if poison else None

    class FsdpTuneTrainer(SFTTrainer):
        """SFTTrainer whose FULL_STATE_DICT saves go through fsdp-tune's gather (see save.py)."""

        def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
            if self.is_fsdp_enabled and "FULL_STATE_DICT" in str(self.accelerator.state.fsdp_plugin.state_dict_type):
                output_dir = output_dir or self.args.output_dir
                save_adapter(self, output_dir)
                if self.args.should_save and self.processing_class is not None:
                    self.processing_class.save_pretrained(output_dir)
                return
            super().save_model(output_dir, _internal_call)

        def _save_checkpoint(self, model, trial) -> None:
            # Mark the new checkpoint complete before any old one is deleted (save_total_limit), so at
            # every moment the newest complete checkpoint, the one `latest` resumes from, exists.
            limit = self.args.save_total_limit
            self.args.save_total_limit = None
            try:
                super()._save_checkpoint(model, trial)
            finally:
                self.args.save_total_limit = limit
            if self.args.should_save:
                run_dir = self._get_output_dir(trial=trial)
                mark_complete(run_dir, self.state.global_step)
                if limit:
                    rotate_checkpoints(
                        output_dir=run_dir,
                        save_total_limit=limit,
                        use_mtime=True,
                        best_model_checkpoint=self.state.best_model_checkpoint,
                    )

        def compute_loss(self, model, inputs, *args, **kwargs):
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            if poison_step is not None and self.state.global_step + 1 == poison_step:
                loss = loss * float("nan")  # test-only fault injection (training calls return the loss alone)
            return loss

        def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
            # A FULL checkpoint of ours holds the whole adapter: every rank reads it (it is small) and
            # torch's state-dict API puts each rank's shard in place. accelerate's FULL path (rank 0
            # loads, then broadcasts) stalls under FSDP2 on gloo, and PEFT's load_adapter does not
            # know about DTensor shards.
            if self.is_fsdp_enabled and load_adapter_into_fsdp(self, resume_from_checkpoint):
                return
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    return FsdpTuneTrainer
