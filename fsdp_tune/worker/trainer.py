"""SFTConfig from the rank spec, and the SFTTrainer subclass that saves correctly under FSDP."""

from __future__ import annotations

import os

from fsdp_tune.launch.spec import RankSpec


def sft_config(spec: RankSpec):
    """SFTConfig exactly as the spec's trainer_args (and its device mesh, when it has one)."""
    from trl import SFTConfig

    args = installed_names(dict(spec.trainer_args), SFTConfig)
    if spec.parallelism:
        args["parallelism_config"] = parallelism_config(spec.parallelism)
    config = SFTConfig(**args)
    if spec.fsdp_mixed_precision:
        import torch

        # the Trainer builds accelerate's FSDP plugin from these; a policy set here is kept (state.py sets the
        # run's precision only without override)
        policy = {k: getattr(torch, v) for k, v in spec.fsdp_mixed_precision.items()}
        config.fsdp_plugin_args["mixed_precision_policy"] = policy
    return config


def installed_names(args: dict, config_class) -> dict:
    """The spec's trainer arguments in the installed transformers' spelling: the spec uses transformers 5.24's
    `activation_checkpointing[_kwargs]`, which earlier 5.x releases (5.17 included) call `gradient_checkpointing`
    (the same setting: Trainer calls gradient_checkpointing_enable with the kwargs). Any other argument the
    installed SFTConfig lacks is named here, with the versions, rather than as a TypeError from its __init__."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(config_class)}
    if "activation_checkpointing" not in fields:
        for new, old in (
            ("activation_checkpointing", "gradient_checkpointing"),
            ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"),
        ):
            if new in args:
                args[old] = args.pop(new)
    unknown = sorted(k for k in args if k not in fields)
    if unknown:
        from importlib.metadata import version

        raise TypeError(
            f"{config_class.__name__} of trl {version('trl')} / transformers {version('transformers')} takes no "
            f"{', '.join(unknown)}: install the versions in constraints.txt"
        )
    return args


def parallelism_config(mesh: dict):
    """accelerate's ParallelismConfig (the device mesh) from the spec's sizes."""
    from accelerate import ParallelismConfig

    kwargs = dict(mesh)
    strategy = kwargs.pop("cp_comm_strategy", None)
    if strategy is not None:
        from accelerate.utils import TorchContextParallelConfig

        kwargs["cp_handler"] = TorchContextParallelConfig(cp_comm_strategy=strategy)
    return ParallelismConfig(**kwargs)


def trainer_class(save):
    """The SFTTrainer subclass for this rank spec's save decisions (`save`: RankSpec.save)."""
    from transformers.trainer import rotate_checkpoints
    from trl import SFTTrainer

    from fsdp_tune.worker import faults
    from fsdp_tune.worker.callbacks import mark_complete
    from fsdp_tune.worker.hub import pushes_on_save
    from fsdp_tune.worker.save import load_adapter_into_fsdp, save_adapter

    class FsdpTuneTrainer(SFTTrainer):
        """SFTTrainer whose FULL_STATE_DICT saves go through fsdp-tune's gather (see save.py)."""

        def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
            if self.is_fsdp_enabled and save.full_checkpoints:
                output_dir = output_dir or self.args.output_dir
                save_adapter(self, output_dir, save.final)
                if self.args.should_save and self.processing_class is not None:
                    self.processing_class.save_pretrained(output_dir)
                return
            super().save_model(output_dir, _internal_call)
            if self.is_fsdp_enabled and _internal_call and pushes_on_save(self.args):
                # the Trainer pushes the adapter files it finds in the checkpoint: a sharded one has none
                save_adapter(self, output_dir or self.args.output_dir, save.final)

        def _save_checkpoint(self, model, trial) -> None:
            # Mark the new checkpoint complete before any old one is deleted (save_total_limit), so at
            # every moment the newest complete checkpoint, the one `latest` resumes from, exists.
            make_checkpoint_folder(self, trial)  # first: every rank then agrees on the best checkpoint
            limit = self.args.save_total_limit
            self.args.save_total_limit = None
            try:
                super()._save_checkpoint(model, trial)
            finally:
                self.args.save_total_limit = limit
            self.accelerator.wait_for_everyone()  # every rank's files (shards, rng_state_K.pth) are written
            if self.args.should_save:
                run_dir = self._get_output_dir(trial=trial)
                mark_complete(run_dir, self.state.global_step)
                if limit:
                    best = self.state.best_model_checkpoint
                    rotate_checkpoints(run_dir, save_total_limit=limit, use_mtime=True, best_model_checkpoint=best)

        def compute_loss(self, model, inputs, *args, **kwargs):
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            return faults.poison_loss(loss, self.state.global_step + 1)  # test-only; the loss itself otherwise

        def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
            # A FULL checkpoint of ours holds the whole adapter: every rank reads it (it is small) and
            # torch's state-dict API puts each rank's shard in place. accelerate's FULL path (rank 0
            # loads, then broadcasts) stalls under FSDP2 on gloo, and PEFT's load_adapter does not
            # know about DTensor shards.
            if self.is_fsdp_enabled and load_adapter_into_fsdp(self, resume_from_checkpoint, save.resume):
                return
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    return FsdpTuneTrainer


def make_checkpoint_folder(trainer, trial) -> None:
    """transformers looks for the best checkpoint's folder before the FSDP shards that create it are written
    (with the optimizer), so ranks disagreed on the best checkpoint and, with load_best_model_at_end, one rank
    loaded it while the others went on and waited forever. Made first, on every rank, they agree."""
    folder = os.path.join(trainer._get_output_dir(trial=trial), f"checkpoint-{trainer.state.global_step}")
    os.makedirs(folder, exist_ok=True)
