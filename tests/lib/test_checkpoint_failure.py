"""A checkpoint that fails to load or save is named in the failure report (#17, defect 5).

torch.distributed.checkpoint raises CheckpointException, a BaseException: torchrun's @record writes no
error file for it, so the report said "exited with code 1 without a Python exception" and the file was
named only in the rank's log. The rank's entry point (worker/__main__.py) runs here with the recipe
replaced by a real DCP load of a checkpoint whose .metadata is gone.
"""

from __future__ import annotations

import json
import subprocess
import sys

from fsdp_tune.launch.failure import Outcome, failure_report

RANK = """
import os, sys
import torch
import torch.distributed.checkpoint as dcp
import fsdp_tune.worker.recipe as recipe
from fsdp_tune.worker.__main__ import main

checkpoint = sys.argv[1]
dcp.save({"w": torch.ones(4)}, checkpoint_id=checkpoint)
os.remove(os.path.join(checkpoint, ".metadata"))
recipe.run = lambda path, started=None: dcp.load({"w": torch.zeros(4)}, checkpoint_id=checkpoint)
sys.argv = ["fsdp_tune.worker", sys.argv[2]]
main()
"""


def test_a_checkpoint_exception_reaches_the_report_with_the_file(tmp_path) -> None:
    checkpoint = tmp_path / "run" / "checkpoint-4" / "pytorch_model_fsdp_0"
    resolved = tmp_path / "run" / "fsdp_tune_resolved.json"
    resolved.parent.mkdir()
    resolved.write_text(json.dumps({"spec": {"resume_from_checkpoint": str(checkpoint.parent)}}))
    error_file = tmp_path / "error.json"
    env = {"TORCHELASTIC_ERROR_FILE": str(error_file), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", RANK, str(checkpoint), str(resolved)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and error_file.exists(), proc.stderr[-3000:]
    tail = (
        "Root Cause (first observed failure):\n[0]:\n  time      : now\n  host      : node-1\n"
        f"  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 42)\n  error_file: {error_file}\n"
    )
    report = str(failure_report(str(tmp_path / "run"), Outcome(1, None, tail)))
    assert "root cause: RuntimeError: CheckpointException" in report, report
    assert f"{checkpoint}/.metadata" in report and f"while resuming {checkpoint.parent}" in report, report
    assert "without a Python exception" not in report
