"""QLoRA (bitsandbytes 4-bit on CPU), DoRA, parity with one process, FULL checkpoints."""

from __future__ import annotations

import pytest

from tests.dist.conftest import REFERENCE


def test_fsdp2_and_hsdp_match_one_process_with_same_global_batch(train, reference_run, tmp_path) -> None:
    """FSDP2 on 2 ranks (the reference run), HSDP (a 2 x 2 dp_replicate x dp_shard mesh) on 4, and 1 process: one
    global batch of 8, the same losses. The HSDP run's summary records the mesh read off its trained parameters."""
    two = reference_run  # 6 steps, batch 4 per rank; its checkpoints draw nothing from the RNGs
    one = train(
        "--max_steps", "6", "--num_processes", "1", "--per_device_train_batch_size", "8", output_dir=tmp_path / "one"
    )
    hsdp = train(
        *("--max_steps", "6", "--num_processes", "4", "--per_device_train_batch_size", "2"),
        *("--use_parallelism_config", "--parallelism_config_dp_replicate_size", "2"),
        *("--parallelism_config_dp_shard_size", "2"),
        output_dir=tmp_path / "hsdp",
    )
    a, b, c = two.summary["losses"], one.summary["losses"], hsdp.summary["losses"]
    assert len(a) == len(b) == len(c) == 6
    for x, y, z in zip(a, b, c, strict=True):
        assert x == pytest.approx(y, rel=2e-4, abs=2e-4), (a, b)
        assert z == pytest.approx(y, rel=2e-4, abs=2e-4), (c, b)
    assert hsdp.summary["mesh"] == {"dp_replicate": 2, "dp_shard_cp": 2}
    assert two.summary["mesh"] == {"dp_shard_cp": 2}  # a CPU run gets an explicit mesh (decide/rank.py mesh)
    assert "device mesh: dp_replicate 2 x dp_shard 2" in hsdp.proc.stdout  # the plan
    assert "device mesh (read from the trained weights): dp_replicate 2 x dp_shard_cp 2" in hsdp.proc.stdout


def test_qlora_4bit_fsdp2(train) -> None:
    run = train(
        "--use_4bit_quantization",
        "True",
        "--bnb_4bit_quant_storage_dtype",
        "float32",
        "--bnb_4bit_compute_dtype",
        "float32",
        "--use_nested_quant",
        "True",
        "--max_steps",
        "4",
    )
    s = run.summary
    assert s["adapter_check"]["ok"] and s["loss_last"] < s["loss_first"], s["losses"]
    assert "QLoRA: 4-bit nf4, storage float32" in run.proc.stdout


def test_dora(train) -> None:
    run = train("--use_dora", "True", "--max_steps", "4")
    from safetensors import safe_open

    with safe_open(str(run.output_dir / "adapter_model.safetensors"), "pt") as f:
        magnitudes = [k for k in f.keys() if "lora_magnitude_vector" in k]
    assert len(magnitudes) == 28  # 7 linear layers x 4 decoder layers, each whole
    assert "DoRA: r=8" in run.proc.stdout


def _adapter(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


@pytest.mark.parametrize("state_dict_type", ["SHARDED_STATE_DICT", "FULL_STATE_DICT"])
def test_checkpoint_resume_matches_uninterrupted_run(train, reference_run, tmp_path, state_dict_type) -> None:
    """Save every 2 steps; resume a copy of step 4 with `latest`: the final adapter equals the straight run's
    (for SHARDED_STATE_DICT, the base config's own, the reference run).

    FULL_STATE_DICT is the path where Trainer.save_model of a PEFT model under FSDP2 on CPU fails, and where
    accelerate's FULL load stalls: both go through fsdp-tune's own gather/load.
    """
    import shutil

    import torch

    flags = ("--fsdp_state_dict_type", state_dict_type, *REFERENCE)
    if state_dict_type == "SHARDED_STATE_DICT":
        straight = reference_run
    else:
        straight = train(*flags, output_dir=tmp_path / "straight")
    assert all((straight.output_dir / f"checkpoint-{n}" / "fsdp_tune_complete").exists() for n in (2, 4, 6))
    # a FULL checkpoint's model is the adapter file alone: accelerate's second save of it is skipped (SaveSpec)
    full = state_dict_type == "FULL_STATE_DICT"
    assert (straight.output_dir / "checkpoint-4" / "pytorch_model_fsdp.bin").exists() is False
    assert (straight.output_dir / "checkpoint-4" / "adapter_model.safetensors").exists() is full
    from fsdp_tune.rundir.pickles import check_checkpoint

    # every pickle DCP and the Trainer wrote passes the resume's check (#26: the allowlist is not too strict)
    assert [check_checkpoint(straight.output_dir / f"checkpoint-{n}") for n in (2, 4, 6)] == [None] * 3
    from fsdp_tune.rundir.checkpoints import read_marker

    # the marker records the global batch (a resume on another number of ranks is warned with it, PF063)
    batch = {"world_size": 2, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}
    assert read_marker(straight.output_dir / "checkpoint-4")["batch"] == batch
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copytree(straight.output_dir / "checkpoint-4", resumed_dir / "checkpoint-4")
    shutil.copytree(straight.output_dir / "checkpoint-2", resumed_dir / "checkpoint-2")
    (resumed_dir / "checkpoint-4" / "fsdp_tune_complete").unlink()  # an interrupted save: must be skipped
    resumed = train(*flags, "--resume_from_checkpoint", "latest", output_dir=resumed_dir)
    assert "skipping incomplete checkpoint" in resumed.proc.stderr and "checkpoint-4" in resumed.proc.stderr
    assert f"resuming from {resumed_dir / 'checkpoint-2'}" in resumed.proc.stderr
    assert (resumed_dir / "checkpoint-4").exists()  # skipped, never deleted
    a, b = _adapter(straight.output_dir), _adapter(resumed_dir)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize(
    "extra",
    [
        ("--fsdp_state_dict_type", "FULL_STATE_DICT"),
        (
            "--num_processes",
            "1",
            "--use_4bit_quantization",
            "True",
            "--bnb_4bit_quant_storage_dtype",
            "float32",
            "--bnb_4bit_compute_dtype",
            "float32",
        ),
    ],
    ids=["2 ranks FULL checkpoints", "1 rank QLoRA"],
)
def test_saves_with_fsdp_activation_checkpointing(train, extra) -> None:
    """FSDP's activation checkpointing wraps the layers: names change, and PEFT's own save wrote an empty file."""
    run = train(
        "--fsdp_activation_checkpointing",
        "true",
        "--gradient_checkpointing",
        "false",
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
        "--max_steps",
        "4",
        *extra,
    )
    assert run.summary["adapter_check"]["lora_tensors"] == 56
    assert "checkpointing: FSDP activation checkpointing" in run.proc.stdout
    checkpoint = run.output_dir / "checkpoint-2"
    assert (checkpoint / "fsdp_tune_complete").exists()
    if "FULL_STATE_DICT" in extra:
        from safetensors import safe_open

        with safe_open(str(checkpoint / "adapter_model.safetensors"), "pt") as f:
            assert len(list(f.keys())) == 56
