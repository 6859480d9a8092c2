"""Elastic restart: a rank killed at step 3 under --max_restarts 1, the ranks restarted by torchrun from the last
checkpoint, the final adapter the uninterrupted reference run's. (It reads the session's reference run, so it
stands in the shared launches' unit of work (tests/workers.py); the other faults, which read no session launch, run
apart in test_faults.py.)"""

from __future__ import annotations

from tests.dist.conftest import REFERENCE

SAVE_EVERY_2 = REFERENCE  # the reference run's flags: a checkpoint every 2 steps, 6 steps


def test_elastic_restart_resumes_and_matches_uninterrupted_run(train, reference_run, tmp_path) -> None:
    import torch
    from safetensors.torch import load_file

    straight = reference_run  # the same flags, uninterrupted
    restarted = train(
        *SAVE_EVERY_2, "--max_restarts", "1", output_dir=tmp_path / "restarted", env={"FSDP_TUNE_TEST_KILL": "1:3"}
    )
    log = (restarted.output_dir / "logs" / "rank-0.log").read_text()
    assert "restart 1: resuming from" in log and "checkpoint-2" in log
    a = load_file(str(straight.output_dir / "adapter_model.safetensors"))
    b = load_file(str(restarted.output_dir / "adapter_model.safetensors"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)
