"""A stand-in for torchrun and the ranks, for the launcher's side of a run (no torch, no processes).

It writes into the output folder what real ranks write (checkpoints with Trainer's files and fsdp-tune's
completion marker, the summary), so `train` can be driven through its whole launcher path in milliseconds.
Tests take it as the `fake_ranks` fixture (tests/unit/conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fsdp_tune import summary as run_summary
from fsdp_tune.launch.failure import Outcome
from fsdp_tune.runfiles import MANIFEST_NAME
from tests.conftest import FIXTURES, REPO
from tests.unit.fake_checkpoint import write_dcp, write_trainer_files

# a torchrun that finishes when the launcher writes the stop file (argv[-1] is the rank spec's path)
WAITS_FOR_STOP_FILE = (
    "import os, sys, time\n"
    "stop = os.path.join(os.path.dirname(sys.argv[-1]), 'fsdp_tune_stop')\n"
    "while not os.path.exists(stop): time.sleep(0.05)\n"
)


def write_checkpoint(out: Path, step: int, run_id: str | None, marked: bool = True) -> Path:
    """What Trainer writes into a SHARDED_STATE_DICT checkpoint of a 2-rank LoRA run (tests/unit/fake_checkpoint.py),
    and fsdp-tune's completion marker."""
    folder = out / f"checkpoint-{step}"
    write_dcp(folder / "pytorch_model_fsdp_0", 2, step)
    write_dcp(folder / "optimizer_0", 2, step)
    write_trainer_files(folder, 2, step)
    if marked:
        from fsdp_tune.rundir.checkpoints import write_marker

        write_marker(folder, step, run_id)
    return folder


@dataclass
class Launch:
    checkpoints: list[int] = field(default_factory=list)
    stop_at: int | None = None  # write an Interrupted summary (a checkpoint at that step)
    signal_seen_by_launcher: int | None = None  # Outcome.signal
    returncode: int = 0
    torchrun_tail: str = ""  # what torchrun printed (a failed rank's Root Cause block)


@dataclass
class FakeRanks:
    plan: list[Launch] = field(default_factory=list)
    specs: list = field(default_factory=list)
    secret_envs: list = field(default_factory=list)  # what reached the ranks' environment only

    def next(self, **kw) -> None:
        self.plan.append(Launch(**kw))

    def __call__(self, spec, run_id=None, keep_fds=(), secret_env=None, attempt=None) -> Outcome:
        self.specs.append(spec)
        self.secret_envs.append(secret_env or {})
        launch = self.plan.pop(0) if self.plan else Launch(checkpoints=[])
        out = Path(spec.output_dir)
        resolved = json.loads(Path(spec.resolved_path).read_text())
        rid = resolved.get("run_id")
        for step in launch.checkpoints:
            write_checkpoint(out, step, rid)
        before = os.environ.get(run_summary.ATTEMPT_ENV)
        os.environ[run_summary.ATTEMPT_ENV] = attempt or ""  # what torchrun passes the ranks
        try:
            if launch.stop_at is not None:
                write_checkpoint(out, launch.stop_at, rid)
                run_summary.write(out, run_summary.Interrupted(launch.stop_at, True, signal.SIGTERM), rid)
            elif launch.returncode == 0 or launch.signal_seen_by_launcher:
                steps = max(launch.checkpoints, default=1)
                run_summary.write(out, finished(steps, str(out)), rid)
        finally:
            os.environ.pop(run_summary.ATTEMPT_ENV)
            if before is not None:
                os.environ[run_summary.ATTEMPT_ENV] = before
        return Outcome(launch.returncode, launch.signal_seen_by_launcher, launch.torchrun_tail)


def finished(steps: int, adapter_dir: str) -> run_summary.RunSummary:
    return run_summary.RunSummary(
        steps=steps,
        loss_first=2.0,
        loss_last=1.0,
        losses=[2.0, 1.0],
        train_runtime_s=1.0,
        time_to_first_step_s=0.1,
        wall_s=2.0,
        tokens=100,
        tokens_per_s=100.0,
        per_rank=[run_summary.RankMemory(100.0)],
        fsdp_units={"LlamaDecoderLayer": 4},
        adapter_dir=adapter_dir,
        use_peft_lora=False,
    )


def stub_launcher(out: Path, *flags: str, torchrun_code: str = WAITS_FOR_STOP_FILE) -> subprocess.Popen:
    """A real `fsdp-tune train` process whose torchrun is `torchrun_code`; returns once that runs."""
    code = (
        "import sys\n"
        "import fsdp_tune.launch.torchrun as t\n"
        f"t.command = lambda spec: [sys.executable, '-c', {torchrun_code!r}, spec.resolved_path]\n"
        "from fsdp_tune.cli.app import main\n"
        "main()\n"
    )
    config = str(FIXTURES / "tiny_lora.yaml")
    cmd = [sys.executable, "-c", code, "train", "--config", config, "--output_dir", str(out), *flags]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out / MANIFEST_NAME).exists():  # it owns the folder and its torchrun runs
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.3)  # the stub has started and the launcher's handlers are in place
    return proc
