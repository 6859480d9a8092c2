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
        fsdp_config=fsdp_config(cfg),
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
    args.setdefault("report_to", "none")
    for key in ("report_to",):
        if isinstance(args.get(key), tuple):
            args[key] = list(args[key])
    return SFTConfig(**args)


def trainer_class():
    from trl import SFTTrainer

    from fsdp_tune.worker.save import load_adapter_into_fsdp, save_adapter

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

        def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
            # A FULL checkpoint of ours holds the whole adapter: every rank reads it (it is small) and
            # torch's state-dict API puts each rank's shard in place. accelerate's FULL path (rank 0
            # loads, then broadcasts) stalls under FSDP2 on gloo, and PEFT's load_adapter does not
            # know about DTensor shards.
            if self.is_fsdp_enabled and load_adapter_into_fsdp(self, resume_from_checkpoint):
                return
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    return FsdpTuneTrainer
