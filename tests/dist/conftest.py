"""Real multi-process runs on CPU (gloo, FSDP2) through the `fsdp-tune` CLI, with bounded timeouts.

On failure the assertion message carries every rank's log, so a broken run explains itself in CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, offline_env

BASE = FIXTURES / "tiny_lora.yaml"
TIMEOUT = int(os.environ.get("FSDP_TUNE_TEST_TIMEOUT", "300"))


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    output_dir: Path

    @property
    def summary(self) -> dict:
        return json.loads((self.output_dir / "fsdp_tune_summary.json").read_text())

    def logs(self) -> str:
        parts = [
            f"--- exit {self.proc.returncode}\n--- stdout\n{self.proc.stdout[-4000:]}\n--- stderr\n"
            f"{self.proc.stderr[-6000:]}"
        ]
        for log in sorted((self.output_dir / "logs").glob("rank-*.log")):
            parts.append(f"--- {log.name}\n{log.read_text()[-4000:]}")
        return "\n".join(parts)


def run_train(
    out: Path,
    model_cache: Path,
    *flags: str,
    config: Path = BASE,
    check: bool = True,
    env: dict | None = None,
    timeout: int = TIMEOUT,
) -> Run:
    """`fsdp-tune train --config CONFIG --output_dir OUT FLAGS...` as a user runs it, offline."""
    cmd = [sys.executable, "-m", "fsdp_tune", "train", "--config", str(config), "--output_dir", str(out), *flags]
    full_env = offline_env(model_cache)
    full_env.update(env or {})  # a test may override any of these
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    run = Run(proc, out)
    if check:
        assert proc.returncode == 0, run.logs()
    return run


@pytest.fixture
def train(tmp_path, model_cache):
    """A run of the test's own (into tmp_path/run unless output_dir says otherwise)."""

    def _train(*flags: str, output_dir: Path | None = None, **kw) -> Run:
        return run_train(output_dir or tmp_path / "run", model_cache, *flags, **kw)

    return _train


# The reference run: the base config (LoRA, FSDP2, 2 CPU ranks), 6 steps, a SHARDED_STATE_DICT checkpoint every 2.
# Tests that only read a finished run's outputs (its adapter, summary, logs, checkpoints) share this one launch.
REFERENCE = ("--save_strategy", "steps", "--save_steps", "2", "--max_steps", "6")


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, model_cache) -> Run:
    """Read only: a test that changes what it finds copies it first."""
    return run_train(tmp_path_factory.mktemp("reference") / "run", model_cache, *REFERENCE)
