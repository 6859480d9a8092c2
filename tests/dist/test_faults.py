"""Faults: a killed rank, NaN loss, a crashing rank, a broken model folder, a hung rank. (The elastic restart after a
killed rank, compared with the reference run: test_elastic_restart.py, a file of its own so this one, which reads no
session launch, is a unit of work apart from the shared launches' (tests/workers.py). Stop signals, every way a
scheduler delivers them: test_preemption.py.)"""

from __future__ import annotations

import json
import time

from tests.dist.conftest import REFERENCE

SAVE_EVERY_2 = REFERENCE  # the reference run's flags: a checkpoint every 2 steps, 6 steps


def test_killed_rank_is_reported_quickly(train) -> None:
    start = time.monotonic()
    run = train(*SAVE_EVERY_2, env={"FSDP_TUNE_TEST_KILL": "1:3"}, check=False)
    assert run.proc.returncode == 1, run.logs()
    assert time.monotonic() - start < 90  # the whole run incl. start-up; the failure itself is seconds
    err = run.proc.stderr
    assert "training failed on rank 1" in err and "killed by SIGKILL" in err, err[-3000:]
    assert "rank-1.log" in err


def test_nan_loss_stops_and_keeps_last_good_checkpoint(train) -> None:
    """Also the console of a rank raising after launch: the plan, the phases, then the failure report (root
    cause, the frames that matter, the rank log named), at most 30 lines in all; the whole tracebacks (every
    rank's, torchrun's) are in the logs, not on the console."""
    run = train(*SAVE_EVERY_2, env={"FSDP_TUNE_TEST_POISON_STEP": "3"}, check=False)
    assert run.proc.returncode == 1, run.logs()
    assert "loss became NaN/inf at step 3" in run.proc.stderr
    console = run.proc.stdout + run.proc.stderr
    assert len(console.splitlines()) <= 30, console
    assert "Traceback" not in console and "ChildFailedError" not in console, console
    rank = run.proc.stderr.split("training failed on rank ")[1][0]  # both ranks raise; either is seen first
    assert f"full log:   {run.output_dir / 'logs' / f'rank-{rank}.log'} (the whole traceback)" in console, console
    assert "where:      fsdp_tune/worker/recipe.py" in run.proc.stderr, console
    assert "Traceback" in (run.output_dir / "logs" / f"rank-{rank}.log").read_text()
    assert "ChildFailedError" in (run.output_dir / "logs" / "torchrun.log").read_text()
    assert (run.output_dir / "checkpoint-2" / "fsdp_tune_complete").exists()
    assert not (run.output_dir / "checkpoint-4").exists()
    assert not (run.output_dir / "adapter_model.safetensors").exists()

    # the checkpoint says which adapter it holds (PEFT's adapter_config.json, listed in its marker): a resume
    # with another shape is refused before any rank starts, naming the difference (it crashed after launch)
    marker = json.loads((run.output_dir / "checkpoint-2" / "fsdp_tune_complete").read_text())
    assert json.loads((run.output_dir / "checkpoint-2" / "adapter_config.json").read_text())["r"] == 8
    assert "adapter_config.json" in marker["files"]
    refused = train(*SAVE_EVERY_2, "--resume_from_checkpoint", "latest", "--lora_r", "16", check=False)
    assert refused.proc.returncode == 2 and "PF039" in refused.proc.stderr, refused.logs()
    assert "checkpoint-2 was trained with r 8 (this launch: 16)" in refused.proc.stderr


def test_a_broken_model_folder_is_refused_before_launch(train, tmp_path, model_cache, monkeypatch) -> None:
    """A model folder whose config.json does not match its weights (an edited config) used to pass validation and
    fail on every rank in from_pretrained ("ignore_mismatched_sizes"); the pre-flight reads the real safetensors
    header and refuses it (PF007), as it refuses a cut-short weights file (PF004). No rank starts."""
    import shutil

    from fsdp_tune.sources.builtin import materialize

    monkeypatch.setenv("FSDP_TUNE_CACHE", str(model_cache))
    broken = tmp_path / "broken-model"
    shutil.copytree(materialize("tiny-llama"), broken)
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] *= 2
    (broken / "config.json").write_text(json.dumps(config))
    run = train("--model_name_or_path", str(broken), check=False)
    assert run.proc.returncode == 2, run.logs()
    assert "PF007" in run.proc.stderr and "config.json and the weights disagree" in run.proc.stderr, run.logs()
    assert "mlp.down_proj.weight is [128, 256] in model.safetensors, config.json makes it [128, 512]" in run.proc.stderr
    assert not (run.output_dir / "logs").exists()

    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    refused = train("--model_name_or_path", str(broken), check=False, output_dir=tmp_path / "run2")
    assert refused.proc.returncode == 2 and "PF004" in refused.proc.stderr, refused.logs()
    assert "model.safetensors is cut short" in refused.proc.stderr


def test_hung_rank_times_out_and_is_named(train) -> None:
    start = time.monotonic()
    run = train("--max_steps", "6", "--ddp_timeout", "20", env={"FSDP_TUNE_TEST_HANG": "1:3"}, check=False, timeout=240)
    assert run.proc.returncode == 1, run.logs()
    assert time.monotonic() - start < 180  # bounded by --ddp_timeout, not hanging forever
    err = run.proc.stderr
    assert "training failed on rank 0" in err and "Timed out" in err, err[-3000:]
    assert "waiting on: rank 1, which raised no error" in err, err[-3000:]
