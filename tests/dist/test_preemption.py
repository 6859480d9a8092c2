"""Preemption as schedulers deliver it (#17, defect 3): each delivery ends with a checkpoint, exit 143 and
the resume hint, and the next launch resumes it. One output folder, one chain of real 2-rank runs:

  1. SIGTERM to fsdp-tune, torchrun and the ranks at once (scancel / srun; torchrun forwards it again)
  2. SIGTERM to the ranks only
  3. SIGUSR1 to all of them (SLURM's --signal=USR1@T)
  4. SIGHUP to fsdp-tune only (the terminal went away)
  5. the last resume runs to the end with its stdout read by `head -1` (the reader leaves early)

and every checkpoint's marker names this run and lists its files (resume verifies them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fsdp_tune.launch.stopping import children
from fsdp_tune.runfiles import COMPLETE_MARKER, MANIFEST_NAME, METRICS_NAME
from tests.dist.conftest import BASE, TIMEOUT, offline_env

# a constant learning rate: the last resume ends the run early (--max_steps), which a schedule laid out for 400
# steps would refuse (PF065)
CONSTANT = ("--lr_scheduler_type", "constant")
LONG = ("--max_steps", "400", "--save_strategy", "steps", "--save_steps", "1000", *CONSTANT)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


class Launch:
    def __init__(self, out: Path, model_cache: Path, log: Path, *flags: str, stdout=None):
        self.out, self.log = out, log
        cmd = [sys.executable, "-m", "fsdp_tune", "train", "--config", str(BASE), "--output_dir", str(out), *flags]
        self.err = open(log, "w")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            cmd, env=offline_env(model_cache), stdout=stdout or subprocess.DEVNULL, stderr=self.err, text=True
        )

    def training(self, before: int) -> None:
        """Wait until two more steps are logged: the ranks are inside the training loop."""
        deadline = time.monotonic() + TIMEOUT
        while _lines(self.out / METRICS_NAME) < before + 2:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.stderr()
            time.sleep(0.1)

    def pids(self) -> tuple[int, list[int]]:
        [torchrun] = children(self.proc.pid)
        return torchrun, children(torchrun)

    def wait(self) -> int:
        try:
            code = self.proc.wait(timeout=TIMEOUT)
        finally:
            self.proc.kill()
            self.err.close()
        return code

    def stderr(self) -> str:
        text = self.log.read_text() if self.log.exists() else ""
        ranks = sorted((self.out / "logs").glob("rank-*.log"))
        return text[-5000:] + "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in ranks)


def _preempted(launch: Launch, steps_seen: list[int]) -> int:
    code = launch.wait()
    err = launch.stderr()
    assert code == 143, err
    assert "checkpoint saved; continue with --resume_from_checkpoint latest" in err, err
    step = int(err.split("stopped at step ")[1].split(":")[0])
    assert step > (steps_seen[-1] if steps_seen else 0), err
    steps_seen.append(step)
    return step


def test_every_delivery_checkpoints_and_resumes(tmp_path, model_cache) -> None:
    out = tmp_path / "run"
    seen: list[int] = []
    resume = ("--resume_from_checkpoint", "latest")

    first = Launch(out, model_cache, tmp_path / "1.err", *LONG)
    first.training(0)
    torchrun, ranks = first.pids()
    for pid in (first.proc.pid, torchrun, *ranks):  # as scancel does: every process of the job step
        os.kill(pid, signal.SIGTERM)
    _preempted(first, seen)
    run_id = json.loads((out / MANIFEST_NAME).read_text())["run_id"]

    second = Launch(out, model_cache, tmp_path / "2.err", *LONG, *resume)
    second.training(_lines(out / METRICS_NAME))
    for pid in second.pids()[1]:  # the ranks only
        os.kill(pid, signal.SIGTERM)
    _preempted(second, seen)
    assert "stopped by SIGTERM (received by the ranks)" in second.stderr()

    third = Launch(out, model_cache, tmp_path / "3.err", *LONG, *resume)
    third.training(_lines(out / METRICS_NAME))
    torchrun, ranks = third.pids()
    for pid in (third.proc.pid, torchrun, *ranks):
        os.kill(pid, signal.SIGUSR1)
    _preempted(third, seen)

    fourth = Launch(out, model_cache, tmp_path / "4.err", *LONG, *resume)
    fourth.training(_lines(out / METRICS_NAME))
    fourth.proc.send_signal(signal.SIGHUP)
    _preempted(fourth, seen)

    for step in seen:  # one checkpoint per preemption, each this run's, each listing its files
        marker = json.loads((out / f"checkpoint-{step}" / COMPLETE_MARKER).read_text())
        assert marker["run_id"] == run_id and marker["global_step"] == step
        assert {"scheduler.pt", "optimizer_0/.metadata", "rng_state_0.pth", "rng_state_1.pth"} <= set(marker["files"])
    assert json.loads((out / MANIFEST_NAME).read_text())["run_id"] == run_id  # resumes continue the run

    # #48: a changed learning rate would be ignored on resume (optimizer.pt, scheduler.pt) while the record said it:
    # refused before any rank starts, the record untouched
    record = (out / MANIFEST_NAME).read_text()
    refused = Launch(out, model_cache, tmp_path / "lr.err", *LONG, "--learning_rate", "0.001", *resume)
    assert refused.wait() == 2 and "PF065" in refused.stderr() and "--learning_rate 0.005" in refused.stderr()
    assert (out / MANIFEST_NAME).read_text() == record

    last = Launch(
        out,
        model_cache,
        tmp_path / "5.err",
        "--max_steps",
        str(seen[-1] + 2),
        *CONSTANT,
        *resume,
        stdout=subprocess.PIPE,
    )
    assert last.proc.stdout.readline()  # `| head -1`: one line, then the reader is gone
    last.proc.stdout.close()
    assert last.wait() == 0, last.stderr()
    err = last.stderr()
    assert (
        f"resuming from {out / f'checkpoint-{seen[-1]}'} (step {seen[-1]}, run {run_id}, the run this folder holds)"
        in err
    )
    assert json.loads((out / "fsdp_tune_summary.json").read_text())["steps"] == seen[-1] + 2
    assert (out / "adapter_model.safetensors").exists()
