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

from tests.conftest import FIXTURES

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


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One builtin model per test session, shared by every run (as on a user's machine)."""
    cache = os.environ.get("FSDP_TUNE_TEST_CACHE")
    return Path(cache) if cache else tmp_path_factory.mktemp("fsdp-tune-cache")


def offline_env(model_cache: Path) -> dict[str, str]:
    """The environment every `fsdp-tune` command of the tests runs in: offline, the session's model cache."""
    return dict(
        os.environ,
        FSDP_TUNE_CACHE=str(model_cache),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_DATASETS_CACHE=str(model_cache / "datasets"),
    )


@pytest.fixture
def train(tmp_path, model_cache):
    def _train(
        *flags: str,
        output_dir: Path | None = None,
        config: Path = BASE,
        check: bool = True,
        env: dict | None = None,
        timeout: int = TIMEOUT,
    ) -> Run:
        out = output_dir or tmp_path / "run"
        cmd = [sys.executable, "-m", "fsdp_tune", "train", "--config", str(config), "--output_dir", str(out), *flags]
        full_env = offline_env(model_cache)
        full_env.update(env or {})  # a test may override any of these
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
        run = Run(proc, out)
        if check:
            assert proc.returncode == 0, run.logs()
        return run

    return _train
