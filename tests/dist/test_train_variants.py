"""QLoRA (bitsandbytes 4-bit on CPU), DoRA, parity with one process, FULL checkpoints, FSDP activation checkpointing.
The variants read here train in group launches for the session (tests/dist/conftest.py `variants`, `one_rank`, and
`continued` for the resumes); HSDP and the --verbose console go through the CLI."""

from __future__ import annotations

import json

import pytest


def test_fsdp2_and_hsdp_match_one_process_with_same_global_batch(train, reference_run, one_rank, tmp_path) -> None:
    """FSDP2 on 2 ranks (the reference run), HSDP (a 2 x 2 dp_replicate x dp_shard mesh) on 4, and 1 process: one
    global batch of 8, the same losses. The HSDP run's summary records the mesh read off its trained parameters.
    The HSDP run is also the --verbose run: what the libraries print shows live (HF's log dicts, tqdm), and still
    goes to the log; fsdp-tune's own lines show once, not twice."""
    two = reference_run  # 6 steps, batch 4 per rank; its checkpoints draw nothing from the RNGs
    one = one_rank["one process"]
    hsdp = train(
        *("--max_steps", "6", "--num_processes", "4", "--per_device_train_batch_size", "2", "--verbose"),
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
    assert one.summary["per_rank"] and len(one.summary["per_rank"]) == 1
    assert "device mesh: dp_replicate 2 x dp_shard 2" in hsdp.proc.stdout  # the plan
    assert "device mesh (read from the trained weights): dp_replicate 2 x dp_shard_cp 2" in hsdp.proc.stdout
    assert "{'loss'" in hsdp.proc.stdout and "it/s]" in hsdp.proc.stderr, hsdp.logs()  # --verbose
    assert hsdp.proc.stdout.count("loading model ") == 1
    assert "{'loss'" in (hsdp.output_dir / "logs" / "rank-0.log").read_text()


def _logged(run, key: str) -> list[float]:
    lines = (run.output_dir / "metrics.jsonl").read_text().splitlines()
    return [row[key] for row in map(json.loads, lines) if key in row]


def test_context_parallelism_trains_and_evaluates_as_one_process(variants, one_rank) -> None:
    """cp_size 2 on 2 CPU ranks (torch's ring attention through worker/cpu_cp.py) sees each global batch of 8 once,
    split along the sequence; one process sees the same batches whole. Same losses, gradient norms and eval_loss
    (the true loss, not cp_size times it) within 2e-4, as the FSDP/HSDP parity above (measured: 1e-7 relative; the
    ring merges blocks in fp32 in another order than one SDPA call). The adapters: Adam moves an element up to ~lr
    (5e-3) a step whatever its gradient's size, so an element whose gradient is near zero can differ by a fraction
    of a step: every element within 1e-3 (measured 1.5e-4, 6 of 65,536 above 1e-5), the mean difference below 1e-6
    (measured 1e-8)."""
    cp, one = variants["cp"], one_rank["one process eval"]
    assert cp.spec.parallelism.cp_size == 2 and cp.spec.trainer_args.pad_to_multiple_of == 4
    assert cp.spec.loading.path == "sharded"  # over accelerate's dp_shard_cp mesh (worker/loading/sharded.py)
    for key in ("loss", "grad_norm", "eval_loss"):
        a, b = _logged(cp, key), _logged(one, key)
        assert len(a) == len(b) == (1 if key == "eval_loss" else 6), (key, a, b)
        assert a == pytest.approx(b, rel=2e-4, abs=2e-4), (key, a, b)
    x, y = _adapter(cp.output_dir), _adapter(one.output_dir)
    assert x.keys() == y.keys() and len(x) == 56
    diffs = [(x[k] - y[k]).abs() for k in x]
    assert max(d.max().item() for d in diffs) < 1e-3
    assert sum(d.sum().item() for d in diffs) / sum(d.numel() for d in diffs) < 1e-6
    assert max(y[k].abs().max().item() for k in y if "lora_B" in k) > 1e-2  # trained: lora_B starts at zero
    assert "device mesh: cp 2" in cp.plan and cp.summary["mesh"] == {"dp_shard_cp": 2}


def test_qlora_4bit_fsdp2(variants) -> None:
    run = variants["qlora"]  # nested quantization too
    s = run.summary
    assert s["adapter_check"]["ok"] and s["loss_last"] < s["loss_first"], s["losses"]
    assert s["adapter_check"]["lora_tensors"] == 56 and run.spec.model.quantization.bnb_4bit_use_double_quant
    assert "QLoRA: 4-bit nf4, storage float32" in run.plan


def test_dora(variants) -> None:
    run = variants["dora"]
    from safetensors import safe_open

    with safe_open(str(run.output_dir / "adapter_model.safetensors"), "pt") as f:
        magnitudes = [k for k in f.keys() if "lora_magnitude_vector" in k]
    assert len(magnitudes) == 28  # 7 linear layers x 4 decoder layers, each whole
    assert run.summary["adapter_check"]["ok"] and "DoRA: r=8" in run.plan


def _adapter(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


@pytest.mark.parametrize("state_dict_type", ["SHARDED_STATE_DICT", "FULL_STATE_DICT"])
def test_checkpoint_resume_matches_uninterrupted_run(reference_run, variants, continued, state_dict_type) -> None:
    """Save every 2 steps; resume a copy of step 4 with `latest` (tests/dist/conftest.py `continued`: planned as
    `train` plans it): the final adapter equals the straight run's (for SHARDED_STATE_DICT, the base config's own,
    the reference run; for FULL_STATE_DICT, the variants' group).

    FULL_STATE_DICT is the path where Trainer.save_model of a PEFT model under FSDP2 on CPU fails, and where
    accelerate's FULL load stalls: both go through fsdp-tune's own gather/load.
    """
    import torch

    full = state_dict_type == "FULL_STATE_DICT"
    straight = variants["full checkpoints"] if full else reference_run
    assert straight.summary["steps"] == 6 and (not full or straight.spec.full_state_dict)
    assert all((straight.output_dir / f"checkpoint-{n}" / "fsdp_tune_complete").exists() for n in (2, 4, 6))
    # a FULL checkpoint's model is the adapter file alone: accelerate's second save of it is skipped (SaveSpec)
    assert (straight.output_dir / "checkpoint-4" / "pytorch_model_fsdp.bin").exists() is False
    assert (straight.output_dir / "checkpoint-4" / "adapter_model.safetensors").exists() is full
    from fsdp_tune.rundir.pickles import check_checkpoint

    # every pickle DCP and the Trainer wrote passes the resume's check (#26: the allowlist is not too strict)
    assert [check_checkpoint(straight.output_dir / f"checkpoint-{n}") for n in (2, 4, 6)] == [None] * 3
    from fsdp_tune.rundir.checkpoints import read_marker

    # the marker records the global batch (a resume on another number of ranks is warned with it, PF063)
    batch = {"world_size": 2, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}
    assert read_marker(straight.output_dir / "checkpoint-4")["batch"] == batch
    resumed = continued[f"resumed {state_dict_type}"]  # checkpoint-4's completion marker removed: must be skipped
    resumed_dir, said = resumed.output_dir, "\n".join(resumed.said)
    assert resumed.spec.full_state_dict is full and resumed.summary["steps"] == 6, resumed.logs()
    assert "skipping incomplete checkpoint" in said and "checkpoint-4" in said
    assert f"resuming from {resumed_dir / 'checkpoint-2'}" in said
    assert (resumed_dir / "checkpoint-4").exists()  # skipped, never deleted
    a, b = _adapter(straight.output_dir), _adapter(resumed_dir)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize(
    ("group", "name"),
    [("variants", "fsdp-ac full checkpoints"), ("one_rank", "qlora fsdp-ac")],
    ids=["2 ranks FULL checkpoints", "1 rank QLoRA"],
)
def test_saves_with_fsdp_activation_checkpointing(request, group: str, name: str) -> None:
    """FSDP's activation checkpointing wraps the layers: names change, and PEFT's own save wrote an empty file."""
    run = request.getfixturevalue(group)[name]
    assert run.summary["adapter_check"]["lora_tensors"] == 56
    assert "checkpointing: FSDP activation checkpointing" in run.plan
    checkpoint = run.output_dir / "checkpoint-2"
    assert (checkpoint / "fsdp_tune_complete").exists()
    if run.spec.full_state_dict:
        from safetensors import safe_open

        with safe_open(str(checkpoint / "adapter_model.safetensors"), "pt") as f:
            assert len(list(f.keys())) == 56
    else:
        assert run.spec.model.quantization and run.spec.world.world_size == 1
