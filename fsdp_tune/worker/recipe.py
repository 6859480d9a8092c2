"""One rank's run, as a recipe of named steps (torchtune's recipe shape): setup, tokenizer, data, model,
trainer, train, save, summary. Every decision was made by the launcher and comes in the rank spec; the steps
execute it, for whichever training method the spec names (training/methods.py), and each returns a typed
result the later steps read. The recipe keeps the run's state (its Phases); no module does.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import set_seed

from fsdp_tune import summary as run_summary
from fsdp_tune.decide.spec import RankSpec, from_dict
from fsdp_tune.rundir.checkpoints import restart_checkpoint
from fsdp_tune.worker import faults, phases, process
from fsdp_tune.worker.data.lengths import packed, report_truncation
from fsdp_tune.worker.data.prepare import Prepared
from fsdp_tune.worker.data.vision_collate import collator_for, dummy_batches
from fsdp_tune.worker.loading.adapter import lora_config
from fsdp_tune.worker.loading.build import Loaded, load
from fsdp_tune.worker.loading.processor import load_processing, save_processor
from fsdp_tune.worker.loading.reference import REF, reset_to_base
from fsdp_tune.worker.loading.report import FirstStepMemory
from fsdp_tune.worker.logs import console
from fsdp_tune.worker.rank import is_main, restart_count
from fsdp_tune.worker.saving.hub import push_final
from fsdp_tune.worker.saving.save import save_adapter
from fsdp_tune.worker.saving.verify import expected_adapter, verify_adapter
from fsdp_tune.worker.summary import collect, vocab_growth
from fsdp_tune.worker.training.callbacks import (
    MetricsCallback,
    NanGuardCallback,
    ShardingCheckCallback,
    StopOnSignalCallback,
)
from fsdp_tune.worker.training.config import trainer_config
from fsdp_tune.worker.training.methods import method_of
from fsdp_tune.worker.training.progress import ProgressCallback
from fsdp_tune.worker.training.selfcheck import DistributedSelfCheck
from fsdp_tune.worker.training.trainer import Saving, fsdp_trainer
from fsdp_tune.worker.wrappers import inner


class TrainingDiverged(RuntimeError):
    pass


@dataclass(frozen=True)
class Handoff:
    """What the launcher wrote for the ranks (OUTPUT_DIR/fsdp_tune_resolved.json): the spec, and the run id
    the ranks write into checkpoint markers, metrics and the summary."""

    spec: RankSpec
    run_id: str | None


@dataclass
class Built:
    """The trainer, and the callbacks whose state the recipe reads after training."""

    trainer: Any
    metrics: MetricsCallback
    nan_guard: NanGuardCallback
    stopper: StopOnSignalCallback
    self_check: DistributedSelfCheck


def read_handoff(resolved_path: str) -> Handoff:
    data = json.loads(Path(resolved_path).read_text())
    return Handoff(from_dict(data["spec"]), data.get("run_id"))


def run(resolved_path: str, started: float | None = None) -> None:
    Recipe(read_handoff(resolved_path), started or time.time()).run()


class Recipe:
    def __init__(self, handoff: Handoff, started: float):
        self.spec, self.run_id = handoff.spec, handoff.run_id
        self.method, self.row = method_of(self.spec)  # the ranks' hook, and the row (config/methods.py)
        self.phases = phases.Phases(started)

    def run(self) -> None:
        process.start(self.spec)
        tokenizer, processor = load_processing(self.spec.model)  # a vision-language model's processor, or None
        args = self.seeded_config()
        with args.main_process_first(desc="dataset preparation"):
            data = self.prepare_data(tokenizer, processor)
        loaded = self.load_model(tokenizer, args)
        built = self.build_trainer(loaded, tokenizer, data, processor)
        truncation = self.report_truncation(built.trainer, len(data.train) if hasattr(data.train, "__len__") else None)
        result = self.train(built.trainer)
        if built.stopper.stopped_at is not None:
            self.finish_interrupted(built)
            return
        check_finite(built.nan_guard)
        saved = self.save(built.trainer, loaded, tokenizer, processor)
        self.push(built.trainer)
        self.write_summary(built, result, truncation, saved, data, loaded)

    def seeded_config(self):
        """The method's config, and every RNG seeded with the spec's seed before data and model (LoRA's initial
        values), as the Trainer's own set_seed would."""
        args = self.trainer_config()
        set_seed(self.spec.seed)
        return args

    def trainer_config(self, path: str | None = None):
        """The method's config from the spec's trainer_args, or from those for a model loaded on `path` (a rank
        that fell back from sharded loading: RankSpec.trainer_args_on)."""
        return trainer_config(self.spec, self.method.config_class, self.spec.trainer_args_on(path))

    def prepare_data(self, tokenizer, processor=None) -> Prepared:
        with self.phases.timed("build_data"):
            return self.method.prepare(self.spec, tokenizer, processor)

    def load_model(self, tokenizer, args) -> Loaded:
        """The model on the spec's loading path (worker/loading/build.py), and the config that trains it (the
        transformers path's, when a rank finds that sharded loading cannot take this model and falls back)."""
        with self.phases.timed("build_model"):
            loaded = load(self.spec, tokenizer, args, lambda: self.trainer_config("transformers"))
            if loaded.path == "sharded":
                faults.unmanaged_parameter(loaded.model, self.spec.output_dir)  # test-only: the self-check's divergence
            faults.copied_experts(loaded.model, self.spec.output_dir)  # test-only: the expert self-check's wrong mesh
        if is_main():
            phases.show_model(self.phases.took["build_model"], loaded.model, self.spec.model)
        return loaded

    def build_trainer(self, loaded: Loaded, tokenizer, data: Prepared, processor=None) -> Built:
        """The method's trainer; a vision-language model's with its processor and, for data with images, the
        collator that expands them and keeps every rank running the vision tower (worker/data/vision_collate.py)."""
        spec = self.spec
        with self.phases.timed("build_trainer"):
            metrics = MetricsCallback(spec.output_dir, self.run_id)
            nan_guard = NanGuardCallback(check_grad_norm=spec.check_grad_norm)
            stopper = StopOnSignalCallback(spec.output_dir, save=spec.checkpoint_on_stop, device=spec.device)
            sharding = ShardingCheckCallback(spec.world.world_size, spec.unit_fsdp_config.auto_wrap_policy)
            first_step = FirstStepMemory(loaded.report, lambda: getattr(trainer, "model_wrapped", None))
            self_check = DistributedSelfCheck(spec.world.world_size, spec.fsdp_version, spec.device)
            progress = ProgressCallback(
                spec.device,
                spec.world.world_size,
                self.phases,
                spec.console == "live",
                self.row.eval_metrics,
                self.row.progress,
            )
            made: list = []  # the trainer, once built: the rewards' messages name the step
            extra = self.method.trainer_kwargs(spec, tokenizer, lambda: made[0].state.global_step + 1 if made else None)
            collator = collator_for(spec, data, processor, tokenizer)  # vision rows: the guard's; else TRL's own
            if collator is not None:  # (GRPOTrainer takes no data_collator at all)
                extra = {**extra, "data_collator": collator}
            trainer = fsdp_trainer(self.method.trainer_class, self.method.mixin)(
                model=loaded.model,
                args=loaded.args,
                train_dataset=data.train,
                eval_dataset=data.eval if spec.evaluation else None,
                processing_class=processor or tokenizer,
                peft_config=None if loaded.prebuilt else lora_config(spec),  # sharded loading applied LoRA already
                callbacks=[metrics, nan_guard, stopper, sharding, self_check, progress, first_step]
                + faults.callbacks(),
                saving=Saving(
                    spec.full_state_dict,
                    spec.save.final,
                    spec.save.resume,
                    spec.save.checkpoint,
                    loaded.vocab_grew_from is not None,
                    self.run_id,
                    spec.loading.distributed_config is not None,
                ),
                **extra,
            )
            made.append(trainer)
            if (
                spec.model.reference == "base"
                and spec.model.adapter
                and REF in getattr(trainer.model, "peft_config", {})
            ):
                reset_to_base(trainer.model)  # --reference base: TRL copied the starting adapter into "ref"
        if is_main():  # reading the data and TRL's tokenizing (in the trainer's constructor), as one phase
            seconds = self.phases.took["build_data"] + self.phases.took["build_trainer"]
            phases.show_data(seconds, trainer, data.rows())
        return Built(trainer, metrics, nan_guard, stopper, self_check)

    def report_truncation(self, trainer, rows_in: int | None = None) -> dict | None:
        """What TRL cut at max_seq_len and left out (worker/data/lengths.py); `rows_in`: the training rows
        before the trainer tokenized them."""
        return report_truncation(self.spec, self.method.sequences, trainer.train_dataset, rows_in)

    def train(self, trainer):
        with self.phases.timed("train"):
            return trainer.train(resume_from_checkpoint=self.resume_point())

    def resume_point(self) -> str | None:
        """The launcher's choice; after an elastic restart (torchrun --max_restarts), the newest complete
        checkpoint of this run, so a restarted attempt continues instead of starting over."""
        if restart_count():
            best = restart_checkpoint(self.spec.output_dir)  # checked as the launcher checks a resume (PF060)
            if best is not None:
                console().line(f"restart {restart_count()}: resuming from {best}")
                return best
        return self.spec.resume_from_checkpoint

    def finish_interrupted(self, built: Built) -> None:
        """Interrupted: the checkpoint (if any) is the deliverable; the final adapter is for finished runs."""
        stopper = built.stopper
        if is_main():
            stopped = run_summary.Interrupted(stopper.stopped_at, stopper.save, stopper.signal)
            run_summary.write(self.spec.output_dir, stopped, self.run_id)
        built.trainer.accelerator.wait_for_everyone()

    def save(self, trainer, loaded: Loaded, tokenizer, processor=None) -> dict:
        """The final adapter (all ranks gather, rank 0 writes), the tokenizer (a vision-language model's whole
        processor) and trainer state; rank 0 re-opens the adapter and proves it whole and trained. Returns what the
        summary records about it."""
        spec = self.spec
        with self.phases.timed("save_and_verify"):
            expected = expected_adapter(trainer) if spec.lora is not None else (None, None)
            save_adapter(trainer, spec.output_dir, spec.save.final)
            out = {"vocab_grew": vocab_growth(inner(trainer), loaded.vocab_grew_from, tokenizer), "adapter_check": None}
            if is_main():
                tokenizer.save_pretrained(spec.output_dir)
                if processor is not None:
                    save_processor(processor, spec.output_dir)
                trainer.state.save_to_json(str(Path(spec.output_dir) / "trainer_state.json"))
                if spec.lora is not None:
                    out["adapter_check"] = verify_adapter(spec.output_dir, *expected)
        if is_main():
            phases.show_saved(self.phases.took["save_and_verify"], out["adapter_check"])
        return out

    def push(self, trainer) -> None:
        """--push_to_hub: the adapter just saved and verified, from rank 0 (see worker/saving/hub.py)."""
        if trainer.args.push_to_hub:
            push_final(trainer, self.spec.output_dir)
        trainer.accelerator.wait_for_everyone()

    def write_summary(self, built: Built, result, truncation, saved: dict, data: Prepared, loaded: Loaded) -> None:
        loading = loaded.report.summary()  # a collective, as collect is
        trainer, d = built.trainer, self.spec.data
        dummies = dummy_batches(trainer.data_collator)  # a collective too: the guard's batches, each rank's
        if dummies is not None:
            data.report.setdefault("images", {})["dummy_batches"] = dummies
        if d.packing:  # the sequences TRL packed, into how many rows (#25: "50 rows -> 50 sequences" said nothing)
            data.report["packed"] = packed(
                trainer.train_dataset, len(data.train), trainer.args.packing_strategy, d.max_seq_len
            )
        summary = collect(
            built.trainer,
            self.spec,
            result,
            built.metrics,
            self.phases.started["rank"],
            truncated_sequences=truncation,
            data=data.report,
            extra={"loading": loading, "self_check": built.self_check.result},
            **saved,
        )
        if is_main():
            run_summary.write(self.spec.output_dir, summary, self.run_id)
        built.trainer.accelerator.wait_for_everyone()


def check_finite(nan_guard: NanGuardCallback) -> None:
    if nan_guard.bad_step is not None:
        raise TrainingDiverged(
            f"loss became NaN/inf at step {nan_guard.bad_step}; training stopped and no adapter was written "
            "over the last good checkpoint (lower --learning_rate, or check the data)"
        )
