"""The trainer every method trains with: its TRL trainer class (training/methods.py) with fsdp-tune's saving
mixed in, so FULL_STATE_DICT saves and resumes go through fsdp-tune's gather and load (saving/save.py; FSDP1 unit
by unit, at checkpoints too: RankSpec.save.checkpoint), and checkpoints are marked complete before old ones are
rotated."""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

from transformers import Trainer
from transformers.trainer import rotate_checkpoints

from fsdp_tune.worker import faults
from fsdp_tune.worker.saving.hub import pushes_on_save
from fsdp_tune.worker.saving.replicated import check_same_on_ranks
from fsdp_tune.worker.saving.save import load_adapter_into_fsdp, save_adapter
from fsdp_tune.worker.training.callbacks import mark_complete, record_adapter_config


@dataclass(frozen=True)
class Saving:
    """What the trainer's saves need from the rank spec and the model step."""

    full_state_dict: bool  # RankSpec.full_state_dict: checkpoints hold the whole adapter
    final: str  # RankSpec.save.final: how the adapter leaves the sharded model (saving/save.py)
    resume: str  # RankSpec.save.resume: how a FULL checkpoint's adapter comes back
    checkpoint: str  # RankSpec.save.checkpoint: "adapter_file" (the adapter file alone) | "accelerate"
    vocab_grew: bool  # the chat template's tokens grew the vocabulary: the adapter carries the embedding layers
    run_id: str | None  # written into each checkpoint's completion marker
    sharded_at_load: bool = False  # RankSpec.loading.distributed_config: transformers sharded the model as it loaded


class FsdpSaving:
    """Mixed into a TRL trainer (FsdpSaving first): fsdp-tune's FULL_STATE_DICT save and load, checkpoint
    completion markers, evaluation inside context parallelism's context, and the test-only loss fault."""

    def __init__(self, *args, saving: Saving, **kwargs):
        self.saving = saving
        with checkpoints_of_sharded_at_load(kwargs.get("args"), saving.sharded_at_load):
            super().__init__(*args, **kwargs)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        if self.is_fsdp_enabled and self.saving.full_state_dict:
            output_dir = output_dir or self.args.output_dir
            save_adapter(self, output_dir, self.saving.final)
            if self.args.should_save and self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
            return
        super().save_model(output_dir, _internal_call)
        if self.is_fsdp_enabled and _internal_call and pushes_on_save(self.args):
            # the Trainer pushes the adapter files it finds in the checkpoint: a sharded one has none
            save_adapter(self, output_dir or self.args.output_dir, self.saving.final)

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
            record_adapter_config(self.accelerator.unwrap_model(self.model), run_dir, self.state.global_step)
            mark_complete(run_dir, self.state.global_step, self.saving.run_id, self.args)
            if limit:
                best = self.state.best_model_checkpoint
                rotate_checkpoints(run_dir, save_total_limit=limit, use_mtime=True, best_model_checkpoint=best)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if self.saving.sharded_at_load:  # rank 0 writes the (replicated) optimizer state for every rank
            check_same_on_ranks(self.model, self.optimizer, self.args.device.type)
        # the Trainer saves the model a second time here through accelerate's save_fsdp_model (FULL_STATE_DICT:
        # FSDP1's full state dict of the whole model); with "adapter_file" the adapter file save_model wrote is the
        # checkpoint's model, and everything else (optimizer, scheduler) is saved as the Trainer saves it
        if self.is_fsdp_enabled and self.saving.checkpoint == "adapter_file":
            with without_accelerate_model_save():
                return super()._save_optimizer_and_scheduler(output_dir)
        return super()._save_optimizer_and_scheduler(output_dir)

    def _load_best_model(self) -> None:
        # load_best_model_at_end: the Trainer reads accelerate's model file, which "adapter_file" does not write
        if self.is_fsdp_enabled and self.saving.checkpoint == "adapter_file":
            best = self.state.best_model_checkpoint
            if not load_adapter_into_fsdp(self, best, self.saving.resume):
                raise RuntimeError(f"{best} holds no adapter_model.safetensors: the best model cannot be loaded")
            return
        super()._load_best_model()

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Under context parallelism, transformers' own Trainer.prediction_step, the seed's evaluation: the tokens
        counted (num_items_in_batch) before the batch is sharded, the loss computed inside the context on each
        rank's slice of the sequence (its sum over the whole count, times the ranks: their mean, eval_loss, is the
        true loss). TRL's SFTTrainer replaces it with a forward outside the context: each rank would attend over
        the whole sequence, so a sequence that needs CP to fit in training would not fit in evaluation."""
        config = getattr(self.accelerator, "parallelism_config", None)
        if config is not None and config.cp_enabled:
            return Trainer.prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        return faults.poison_loss(loss, self.state.global_step + 1)  # test-only; the loss itself otherwise

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        if self.saving.sharded_at_load:
            # the adapter's parameters are plain replicated tensors (saving/replicated.py): every rank copies the
            # saved ones in place, the door FULL checkpoints use, rather than PEFT's load_adapter (not run here)
            if not load_adapter_into_fsdp(self, resume_from_checkpoint, "local_rows"):
                raise RuntimeError(f"{resume_from_checkpoint} holds no adapter_model.safetensors: nothing to resume")
            return
        # A FULL checkpoint of ours holds the whole adapter: every rank reads it (it is small) and puts its own
        # part in place (saving/save.py). accelerate's FULL path (rank 0 loads, then broadcasts) stalls under
        # FSDP2 on gloo, and PEFT's load_adapter does not know about DTensor shards.
        if self.is_fsdp_enabled and load_adapter_into_fsdp(self, resume_from_checkpoint, self.saving.resume):
            return
        super()._load_from_checkpoint(resume_from_checkpoint, model)


@contextlib.contextmanager
def checkpoints_of_sharded_at_load(args, sharded_at_load: bool):
    """transformers 5.24's Trainer refuses, in its constructor, any checkpoint of a model sharded at load that saves
    the optimizer (trainer.py:633), for the sake of sharded optimizer state. An expert-parallel LoRA run trains only
    replicated plain tensors (saving/replicated.py checks it at every save): the constructor sees save_only_model
    for that check alone (its other reads there concern accelerate's FSDP, off here), and the run's own value is
    back before training starts."""
    if not sharded_at_load or args is None or args.save_only_model:
        yield
        return
    args.save_only_model = True
    try:
        yield
    finally:
        args.save_only_model = False


@contextlib.contextmanager
def without_accelerate_model_save():
    """transformers.trainer's save_fsdp_model (the name its _save_optimizer_and_scheduler calls) a no-op for the
    block. Refuses, rather than saving the whole model unnoticed, when that name is gone (the probe of the GPU
    check and tests/lib/test_checkpoint_save.py check it is there)."""
    import transformers.trainer as hf_trainer

    if not hasattr(hf_trainer, "save_fsdp_model"):
        raise RuntimeError(
            "transformers.trainer no longer calls save_fsdp_model: fsdp-tune's FULL_STATE_DICT checkpoint "
            "(RankSpec.save.checkpoint = adapter_file) does not know this transformers"
        )
    kept = hf_trainer.save_fsdp_model
    hf_trainer.save_fsdp_model = lambda *args, **kwargs: None
    try:
        yield
    finally:
        hf_trainer.save_fsdp_model = kept


@functools.cache
def fsdp_trainer(base: type, mixin: type | None = None) -> type:
    """`base` (SFTTrainer, ...) with fsdp-tune's saving, and the method's own `mixin` (GRPO's) between them:
    FsdpTuneSFTTrainer and so on."""
    bases = (FsdpSaving, mixin, base) if mixin is not None else (FsdpSaving, base)
    return type(f"FsdpTune{base.__name__}", bases, {"__doc__": " + ".join(b.__name__ for b in reversed(bases))})


def make_checkpoint_folder(trainer, trial) -> None:
    """transformers looks for the best checkpoint's folder before the FSDP shards that create it are written
    (with the optimizer), so ranks disagreed on the best checkpoint and, with load_best_model_at_end, one rank
    loaded it while the others went on and waited forever. Made first, on every rank, they agree."""
    folder = os.path.join(trainer._get_output_dir(trial=trial), f"checkpoint-{trainer.state.global_step}")
    os.makedirs(folder, exist_ok=True)
