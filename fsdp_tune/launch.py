"""Run a LaunchPlan through torchrun, and turn its outcome into a summary or one clear failure report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import ExitCode, LaunchError
from fsdp_tune.plan import LaunchPlan
from fsdp_tune.worker_paths import SUMMARY_NAME


def prepare(cfg: RunConfig, plan: LaunchPlan) -> RunConfig:
    """Materialize builtin models and write the resolved config that every rank reads."""
    name = cfg.model.model_name_or_path or ""
    if name.startswith("builtin:"):
        from fsdp_tune.builtin_models import materialize

        cfg = replace(cfg, model=replace(cfg.model, model_name_or_path=str(materialize(name.removeprefix("builtin:")))))
    out = Path(plan.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(plan.resolved_path + ".tmp")
    tmp.write_text(json.dumps({"config": cfg.as_dict(), "plan": plan.as_dict()}, indent=2))
    tmp.replace(plan.resolved_path)
    return cfg


def run(plan: LaunchPlan) -> int:
    """Start torchrun and wait. SIGINT/SIGTERM are passed on to it (it tears the ranks down)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen(plan.command(), env=env)

    def forward(signum, _frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def failure_report(plan: LaunchPlan, returncode: int) -> LaunchError:
    """One block naming the failing rank, host and root cause, from torchrun's error files."""
    errors = []
    for path in sorted(Path(plan.output_dir, "logs", "torchrun").glob("**/error.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        message = data.get("message", {})
        if isinstance(message, dict):
            text = message.get("message", "")
            ts = int(message.get("extraInfo", {}).get("timestamp", 0) or 0)
        else:
            text, ts = str(message), 0
        rank = path.parent.name
        errors.append((ts, rank, text.strip()))
    if returncode in (-signal.SIGINT, 130):
        return LaunchError("interrupted", ExitCode.INTERRUPTED)
    if returncode in (-signal.SIGTERM, 143):
        return LaunchError("terminated", ExitCode.TERMINATED)
    log_dir = Path(plan.output_dir, "logs")
    if errors:
        ts, rank, text = sorted(errors)[0]
        first_line = text.splitlines()[-1] if text else "unknown error"
        return LaunchError(
            f"training failed on rank {rank} (exit code {returncode}): {first_line}\n"
            f"  full log: {log_dir / f'rank-{rank}.log'}"
        )
    return LaunchError(f"training failed (torchrun exit code {returncode}); rank logs are in {log_dir}")


def read_summary(plan: LaunchPlan) -> dict | None:
    path = Path(plan.output_dir, SUMMARY_NAME)
    return json.loads(path.read_text()) if path.exists() else None
