"""The commands after a run, up to where they would load a model: chat's prompts, merge's argument checks."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.errors import UsageError
from fsdp_tune.rundir.checkpoints import write_marker
from fsdp_tune.tools.chat import prompts_from
from fsdp_tune.tools.merge import merge

runner = CliRunner()


def test_prompts_come_from_flags_then_the_file(tmp_path) -> None:
    file = tmp_path / "prompts.txt"
    file.write_text("Count from 1 to 8.\n\n  Spell the word engine backwards.  \n")
    assert prompts_from(["Hi"], str(file)) == ["Hi", "Count from 1 to 8.", "Spell the word engine backwards."]
    assert prompts_from([], None) == []
    with pytest.raises(UsageError, match="cannot be read"):
        prompts_from([], str(tmp_path / "missing.txt"))


def test_chat_needs_a_run_folder(tmp_path) -> None:
    r = runner.invoke(app, ["chat", str(tmp_path), "--prompt", "Hi"])
    assert r.exit_code == 2 and "no adapter_config.json" in r.output


def test_a_sharded_checkpoint_is_not_taken_for_an_adapter(tmp_path) -> None:
    """A SHARDED checkpoint holds PEFT's adapter_config.json (resume compares it) but its tensors are in the FSDP
    shards: chat and merge say so instead of failing inside PEFT."""
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "some/base"}))
    (tmp_path / "pytorch_model_fsdp_0").mkdir()
    r = runner.invoke(app, ["chat", str(tmp_path), "--prompt", "Hi"])
    assert r.exit_code == 2 and "a sharded checkpoint keeps its adapter inside its FSDP shards" in r.output
    assert f"hint: fsdp-tune export {tmp_path} -o" in r.output  # the command that turns it into an adapter
    with pytest.raises(UsageError, match="no adapter_model.safetensors"):
        merge(str(tmp_path), None, str(tmp_path.parent / "out"), None, "5GB", "cpu", False, None)


def _adapter(tmp_path, quantization) -> str:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "some/base"}))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    spec = {"model": {"quantization": quantization}}
    (tmp_path / "fsdp_tune_resolved.json").write_text(json.dumps({"spec": spec}))
    return str(tmp_path)


def test_merge_into_is_checked_before_anything_loads(tmp_path) -> None:
    lora = _adapter(tmp_path, None)
    with pytest.raises(UsageError, match="not trained against 4-bit weights"):
        merge(lora, None, str(tmp_path / "out"), None, "5GB", "cpu", False, "dequantized")
    with pytest.raises(UsageError, match="--into sideways: unknown"):
        merge(lora, None, str(tmp_path / "out"), None, "5GB", "cpu", False, "sideways")
    with pytest.raises(UsageError, match="--dtype fp8: unknown"):
        merge(lora, None, str(tmp_path / "out"), "fp8", "5GB", "cpu", False, None)


def test_export_checks_the_checkpoint_and_the_folder_before_torch(tmp_path) -> None:
    """`export` answers exit 2 for what it cannot export and for an -o it must not write into, at once."""
    run = tmp_path / "run"
    ckpt = run / "checkpoint-2"
    ckpt.mkdir(parents=True)
    r = runner.invoke(app, ["export", str(ckpt), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and "no adapter_config.json: not a checkpoint of a LoRA run" in r.output
    (ckpt / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "some/base"}))
    r = runner.invoke(app, ["export", str(ckpt), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and "no pytorch_model_fsdp_0/.metadata: not a sharded checkpoint" in r.output
    (ckpt / "pytorch_model_fsdp_0").mkdir()
    (ckpt / "pytorch_model_fsdp_0" / ".metadata").write_bytes(b"\x80\x04cos\nsystem\n.")  # a planted pickle
    r = runner.invoke(app, ["export", str(ckpt), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and "no readable completion marker (fsdp_tune_complete)" in r.output, r.output
    (ckpt / "pytorch_model_fsdp_0" / "__0_0.distcp").write_bytes(b"shard")
    write_marker(ckpt, 2, None)
    r = runner.invoke(app, ["export", str(ckpt), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and "export only checkpoints you wrote" in r.output, r.output
    (ckpt / "pytorch_model_fsdp_0" / "__0_0.distcp").unlink()
    r = runner.invoke(app, ["export", str(ckpt), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and "pytorch_model_fsdp_0/__0_0.distcp is missing (listed in its completion" in r.output
    for target in (run, ckpt / "inside"):
        r = runner.invoke(app, ["export", str(ckpt), "-o", str(target)])
        assert r.exit_code == 2 and "the adapter would be written over it" in r.output, r.output
    (ckpt / "adapter_model.safetensors").write_bytes(b"")  # a FULL_STATE_DICT checkpoint: already an adapter
    r = runner.invoke(app, ["export", str(ckpt), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and f"use it as it is: fsdp-tune chat {ckpt}" in r.output
    assert not (tmp_path / "out").exists()


def test_chat_takes_a_whole_model_folder_without_base(tmp_path) -> None:
    """A folder with config.json and no adapter_config.json is a whole model (merge's output): --base, which names
    an adapter's base, is refused at once (tests/lib/test_loader_door.py loads one)."""
    folder = tmp_path / "merged"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    r = runner.invoke(app, ["chat", str(folder), "--prompt", "Hi", "--base", "some/base"])
    assert r.exit_code == 2 and "is a whole model (config.json, no adapter_config.json), not an adapter" in r.output
