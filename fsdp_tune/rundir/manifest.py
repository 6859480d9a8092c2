"""OUTPUT_DIR/fsdp_tune_run.json: what ran, how, with which versions, and how it ended.

`fsdp-tune train --config OUTPUT_DIR/fsdp_tune_run.json` reads it back as a recipe and reproduces the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.redact import drop_secrets, redact, redact_argv
from fsdp_tune.runfiles import MANIFEST_NAME, write_atomic
from fsdp_tune.sources.versions import RANGES, versions

PACKAGES = tuple(RANGES)  # the stack a run records (sources/versions.py: the libraries with a tested range)


def git_commit(cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=cwd, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=cwd, timeout=5)
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def reproducible_config(cfg: RunConfig) -> dict:
    """The run as a recipe (explicit and non-default settings only, so it validates like the original).
    Secrets are left out (a replay takes them from its environment, HF_TOKEN); token-like values redacted."""
    from fsdp_tune.config.writers import to_recipe

    data = to_recipe(cfg)
    data.get("training", {}).pop("resume_from_checkpoint", None)  # a reproduction starts from step 0
    drop_secrets(data)
    return redact(data)


def base_model(name: str | None) -> dict:
    """The base model as given (for people) and, when it is a local folder, where it is (absolute): `chat` and
    `merge` then find it from any working folder, where the name as given would resolve elsewhere or read as a Hub
    id (tools/base.py)."""
    path = Path(name).expanduser() if name and not name.startswith("builtin:") else None
    return {"name": name, "path": str(path.resolve()) if path is not None and path.is_dir() else None}


def write_start(cfg: RunConfig, spec: RankSpec, run_id: str | None = None, attempt_id: str | None = None) -> Path:
    """Written by node 0 before torchrun starts. `cfg` is the config as the user gave it (a builtin model is
    recorded as builtin:NAME, not as this machine's cache folder), so the manifest reproduces the run anywhere.
    `run_id` names the run the folder holds (a resumed run keeps its id): `latest` resumes only its checkpoints.

    Every launch of the run is an attempt, appended to `attempts` (never replaced). The top level is the run's
    record: the latest attempt, except that a finished run's record stays until another attempt finishes too
    (a failed resume never rewrites what a finished run was)."""
    path = Path(spec.output_dir) / MANIFEST_NAME
    attempt = {
        "attempt_id": attempt_id,
        "command": redact_argv(sys.argv),
        "cwd": os.getcwd(),
        "git_commit": git_commit(),
        "versions": versions(),
        "world": {**asdict(spec.world), "device": spec.device, "backend": spec.backend},
        "resumed_from": spec.resume_from_checkpoint,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "ended_at": None,
        "exit_status": None,
        "resolved_config": reproducible_config(cfg),
        "base_model": base_model(cfg.model.model_name_or_path),
    }
    before = _read(path)
    if before is None or before.get("run_id") != run_id:
        _write(path, {"fsdp_tune_manifest": 1, "run_id": run_id, **attempt, "attempts": [attempt]})
        return path
    attempts = before.get("attempts") or [{k: v for k, v in before.items() if k in attempt}]  # an older manifest
    record = before if before.get("exit_status") == 0 else {**before, **attempt}
    _write(path, {**record, "attempts": [*attempts, attempt]})
    return path


def write_end(spec: RankSpec, exit_status: int, cause: str | None = None) -> None:
    """The end of the latest attempt; it becomes the run's record when it finished, or when the record was not
    a finished run's. `cause`: why a failed attempt stopped (the failure report's root cause), for `report`."""
    path = Path(spec.output_dir) / MANIFEST_NAME
    data = _read(path)
    if data is None:
        return
    ended = {"ended_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "exit_status": exit_status}
    if cause:
        ended["cause"] = cause
    attempts = data.get("attempts") or [{}]
    attempts[-1] = {**attempts[-1], **ended}
    if exit_status == 0 or data.get("exit_status") != 0:
        data = {**data, **attempts[-1]}
    _write(path, {**data, "attempts": attempts})


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n")
