"""A FULL_STATE_DICT checkpoint of an adapter is the adapter file alone (RankSpec.save.checkpoint = "adapter_file"):
the installed transformers' own Trainer._save_optimizer_and_scheduler runs with fsdp-tune's trainer mixed in, and
accelerate's save_fsdp_model (FSDP1's full state dict of the whole model, by reading accelerate 1.15) is never
called while the optimizer and scheduler are saved as the Trainer saves them; the best model comes back from the
adapter file. FSDP1 does not run on CPU: these run the Trainer's code around a stand-in model and optimizer."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers.trainer as hf_trainer
from transformers import Trainer

from fsdp_tune.worker.training import trainer as ours
from fsdp_tune.worker.training.trainer import Saving, fsdp_trainer


class _Scheduler:
    def state_dict(self) -> dict:
        return {"last_epoch": 3}


def _trainer(checkpoint: str, calls: list) -> Trainer:
    """The Trainer class fsdp-tune builds, without its constructor: what _save_optimizer_and_scheduler and
    _load_best_model read under FSDP."""
    trainer = object.__new__(fsdp_trainer(Trainer))
    trainer.saving = Saving(True, "fsdp1_units", "fsdp1_units", checkpoint, False, None)
    trainer.is_fsdp_enabled, trainer.is_deepspeed_enabled = True, False
    plugin = SimpleNamespace(name="fsdp_plugin")
    trainer.accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin))
    trainer.model = trainer.model_wrapped = SimpleNamespace(name="model")
    trainer.optimizer, trainer.lr_scheduler = SimpleNamespace(name="optimizer"), _Scheduler()
    trainer.args = SimpleNamespace(should_save=True)
    trainer.state = SimpleNamespace(best_model_checkpoint="/run/checkpoint-4", best_metric=0.5)
    return trainer


@pytest.fixture
def calls(monkeypatch) -> list:
    seen: list = []
    monkeypatch.setattr(hf_trainer, "save_fsdp_model", lambda *a, **k: seen.append("save_fsdp_model"))
    monkeypatch.setattr(hf_trainer, "save_fsdp_optimizer", lambda *a, **k: seen.append("save_fsdp_optimizer"))
    monkeypatch.setattr(hf_trainer, "load_fsdp_model", lambda *a, **k: seen.append("load_fsdp_model"))
    return seen


def test_adapter_file_checkpoints_skip_accelerates_model_save(calls, tmp_path: Path) -> None:
    recorder = hf_trainer.save_fsdp_model
    _trainer("adapter_file", calls)._save_optimizer_and_scheduler(str(tmp_path))
    assert calls == ["save_fsdp_optimizer"]  # the optimizer as the Trainer saves it; the model not at all
    assert (tmp_path / "scheduler.pt").is_file()  # the rest of the Trainer's save ran
    assert hf_trainer.save_fsdp_model is recorder  # put back after the save


def test_accelerate_checkpoints_keep_accelerates_model_save(calls, tmp_path: Path) -> None:
    _trainer("accelerate", calls)._save_optimizer_and_scheduler(str(tmp_path))
    assert calls == ["save_fsdp_model", "save_fsdp_optimizer"]


def test_the_best_model_comes_back_from_the_adapter_file(calls, monkeypatch) -> None:
    loaded = []
    monkeypatch.setattr(ours, "load_adapter_into_fsdp", lambda t, path, mode: loaded.append((path, mode)) or True)
    _trainer("adapter_file", calls)._load_best_model()
    assert loaded == [("/run/checkpoint-4", "fsdp1_units")] and calls == []
    monkeypatch.setattr(ours, "load_adapter_into_fsdp", lambda *a: False)
    with pytest.raises(RuntimeError, match="holds no adapter_model.safetensors"):
        _trainer("adapter_file", calls)._load_best_model()
    _trainer("accelerate", calls)._load_best_model()
    assert calls == ["load_fsdp_model"]


def test_a_transformers_without_the_name_is_refused(monkeypatch, tmp_path: Path) -> None:
    """Rather than saving the whole model unnoticed when transformers calls accelerate some other way."""
    monkeypatch.delattr(hf_trainer, "save_fsdp_model")
    with pytest.raises(RuntimeError, match="no longer calls save_fsdp_model"):
        _trainer("adapter_file", [])._save_optimizer_and_scheduler(str(tmp_path))
