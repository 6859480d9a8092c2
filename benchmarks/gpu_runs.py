"""Running and judging one GPU-check scenario (the scenarios and their measures: benchmarks/gpu_scenarios.py).

run() returns the scenario's record: "status" pass | fail, "checks" (name -> bool, each printed PASS/FAIL),
"lines" (what the log shows), the measurements, and "failure" (the launcher's and ranks' last words) when a
command failed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from benchmarks.gpu_scenarios import (
    LOSS_TOLERANCE,
    Mode,
    Scenario,
    args_for,
    cli,
    copy_checkpoint,
    failure_text,
    memory_check,
    metrics,
    mfu,
    plan,
    tokens_per_s,
)

SIMULATED_GPU = "NVIDIA H200, 580.159.03, 143771"  # nvidia-smi's name, driver, MiB for --cpu-smoke's refusal


class Clock:
    """The scenario's cap, shared by the commands it runs."""

    def __init__(self, cap: float):
        self.end = time.time() + cap

    def left(self) -> float:
        return max(self.end - time.time(), 1.0)


def run(s: Scenario, mode: Mode, work: Path, cap: float, done: dict) -> dict:
    """Scenario `s` within `cap` seconds; `done`: the records of the scenarios already run (for same_as)."""
    clock = Clock(cap)
    kind = {"train": _train, "resume": _resume, "refuse": _refuse, "paths": _paths}[s.kind]
    record = kind(s, mode, work, clock, done)
    record["status"] = "pass" if record["checks"] and all(record["checks"].values()) else "fail"
    return record


def _one(s: Scenario, mode: Mode, out: Path, clock: Clock, steps: int | None = None, extra=()) -> dict:
    """One training command and what it left: {"ok", "summary", "metrics", "plan", "failure"}."""
    from concurrent.futures import ThreadPoolExecutor

    args = [*args_for(s, mode, steps), *extra]
    on_cpu = mode.device == "cpu" or s.cpu_run
    with ThreadPoolExecutor(1) as pool:  # the plan (seconds of CPU) beside the run's start, not before it
        planning = pool.submit(plan, args, mode, on_cpu, min(120.0, clock.left()))
        proc = cli(["train", *args, "--output_dir", str(out)], mode.env, clock.left())
        planned = planning.result()
    summary_path = out / "fsdp_tune_summary.json"
    if proc.returncode or not summary_path.exists():
        return {"ok": False, "plan": planned, "failure": failure_text(proc, out), "exit": proc.returncode}
    summary = json.loads(summary_path.read_text())
    return {"ok": True, "plan": planned, "summary": summary, "metrics": metrics(out), "exit": 0, "args": args}


def _measures(s: Scenario, mode: Mode, got: dict) -> dict:
    """tokens/s, MFU with its formula, memory against the plan, the adapter check, losses."""
    summary, planned = got["summary"], got["plan"]
    on_cpu = mode.device == "cpu" or s.cpu_run
    tps = tokens_per_s(got["metrics"], mode.warmup)
    value, formula = mfu(tps, planned.get("total_params") or 0, recompute(got["args"]), mode, mode.world(s))
    memory_ok, memory_line = memory_check(summary, planned, on_cpu)
    loading = summary.get("extra", {}).get("loading", {})
    adapter = bool((summary.get("adapter_check") or {}).get("ok"))
    rank0 = (summary.get("per_rank") or [{}])[0]
    record = {
        "loading": loading.get("path"),
        "mesh": summary.get("mesh"),
        "losses": summary.get("losses"),
        "tokens_per_s": tps,
        "mfu": value,
        "mfu_formula": formula,
        "peak_allocated_gib": (rank0.get("peak_gpu_allocated_mib") or 0) / 1024 or None,
        "peak_reserved_gib": (rank0.get("peak_gpu_reserved_mib") or 0) / 1024 or None,
        "peak_rss_gib": (rank0.get("peak_rss_mib") or 0) / 1024,
        "planned_allocated_gib": planned.get("peak_allocated_gib"),
        "planned_per_gpu_gib": planned.get("per_gpu_memory_gib"),
        "planned_host_per_rank_gib": planned.get("per_rank_host_peak_gib"),
        "plan_error": planned.get("error"),
        "checks": {"trained, adapter checked whole": adapter},
    }
    record["memory_ok"] = memory_ok
    if planned.get("error"):  # no plan, no memory verdict: that is a failure of its own
        record["checks"]["fsdp-tune plan for the same flags"] = False
    if memory_ok is not None and not on_cpu:  # on CPU printed, not counted: RSS is mostly the libraries' own
        record["checks"]["memory within 15% of the plan"] = memory_ok
    losses = summary.get("losses") or []
    record["lines"] = [
        f"trained {summary.get('steps')} steps, loss {_loss(losses[:1])} -> {_loss(losses[-1:])}; adapter "
        f"{'ok' if adapter else 'BROKEN'}; loading {record['loading']}; mesh {record['mesh']}",
        f"tokens/s {tps or 0:,.0f}; MFU {formula}",
        (f"plan failed: {planned['error'][-300:]}; " if planned.get("error") else "")
        + memory_line
        + (f"; reserved {record['peak_reserved_gib']:.2f} GiB" if record["peak_reserved_gib"] else "")
        + (f"; plan per GPU {record['planned_per_gpu_gib']} GiB" if record["planned_per_gpu_gib"] else ""),
    ]
    return record


def recompute(args: list[str]) -> bool:
    """Whether the layers are recomputed in the backward (the last --fsdp_activation_checkpointing given)."""
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--fsdp_activation_checkpointing"]
    return bool(values) and values[-1].lower() == "true"


def _loss(values: list) -> str:
    return f"{values[0]:.3f}" if values else "-"


def _failed(got: dict, what: str) -> dict:
    return {
        "checks": {what: False},
        "failure": got["failure"],
        "lines": [f"{what}: FAILED (exit {got['exit']}); see failures.log"],
    }


def _train(s: Scenario, mode: Mode, work: Path, clock: Clock, done: dict) -> dict:
    got = _one(s, mode, work / "run", clock)
    if not got["ok"]:
        return _failed(got, "trained")
    record = _measures(s, mode, got)
    if s.cpu_run and mode.device == "cuda":
        used = record["peak_allocated_gib"]
        record["checks"]["no GPU memory used"] = not used
        record["lines"].append(f"GPU memory used by the CPU run: {used or 0:.2f} GiB")
    if s.same_as:
        other = (done.get(s.same_as) or {}).get("losses")
        ok, line = _same_losses(record["losses"] or [], other, mode.device, s.same_as)
        record["lines"].append(line)
        if ok is not None:
            record["checks"][f"losses as {s.same_as}"] = ok
    return record


def _same_losses(mine: list, other: list | None, device: str, name: str) -> tuple[bool | None, str]:
    if not other:
        return None, f"losses vs {name}: not compared ({name} did not train)"
    diff = max((abs(a - b) / max(abs(b), 1e-9) for a, b in zip(mine, other, strict=False)), default=0.0)
    ok = diff <= LOSS_TOLERANCE[device] and len(mine) == len(other)
    verdict = "PASS" if ok else "FAIL"
    return ok, f"losses vs {name}: max relative difference {diff:.1e} over {len(mine)} steps: {verdict}"


def _resume(s: Scenario, mode: Mode, work: Path, clock: Clock, done: dict) -> dict:
    """Save every k steps over 2k; resume a copy of checkpoint k: steps k+1..2k must match the straight run's."""
    k = max(mode.steps // 2, 2)
    saving = ("--save_strategy", "steps", "--save_steps", str(k))
    straight = _one(s, mode, work / "straight", clock, 2 * k, saving)
    if not straight["ok"]:
        return _failed(straight, "trained with checkpoints")
    record = _measures(s, mode, straight)
    copy_checkpoint(work / "straight", k, work / "resumed")
    resumed = _one(s, mode, work / "resumed", clock, 2 * k, (*saving, "--resume_from_checkpoint", "latest"))
    if not resumed["ok"]:
        failed = _failed(resumed, "resumed from the checkpoint")
        record["checks"].update(failed["checks"])
        record["lines"] += failed["lines"]
        record["failure"] = failed["failure"]
        return record
    after = {m["step"]: m["loss"] for m in straight["metrics"] if "loss" in m and m.get("step", 0) > k}
    again = {m["step"]: m["loss"] for m in resumed["metrics"] if "loss" in m and m.get("step", 0) > k}
    steps = sorted(after)
    mine = [again.get(i, float("inf")) for i in steps]
    ok, line = _same_losses(mine, [after[i] for i in steps], mode.device, "the straight run")
    record["checks"][f"resumed at step {k}, losses as the straight run's"] = bool(ok) and set(again) == set(after)
    record["checks"]["resumed run's adapter checked whole"] = bool(
        (resumed["summary"].get("adapter_check") or {}).get("ok")
    )
    record["lines"].append(f"resumed from checkpoint-{k}, steps {steps}: {line}")
    return record


def _refuse(s: Scenario, mode: Mode, work: Path, clock: Clock, done: dict) -> dict:
    """The launcher refuses (exit 2, PF050) before any process starts: no rank log, nothing built."""
    out = work / "run"
    env = mode.env
    if mode.device == "cpu":  # the same command against a simulated H200: a stand-in nvidia-smi first on the PATH
        fake = work / "bin" / "nvidia-smi"
        fake.parent.mkdir(parents=True, exist_ok=True)
        fake.write_text(f"#!/bin/sh\necho '{SIMULATED_GPU}'\n")
        fake.chmod(0o755)
        env = {**env, "PATH": f"{fake.parent}{os.pathsep}{env.get('PATH', '')}"}
    started = time.time()
    proc = cli(["train", *args_for(s, mode), "--output_dir", str(out)], env, clock.left())
    rank_logs = list((out / "logs").glob("rank-*.log")) if (out / "logs").is_dir() else []
    refusal = [line for line in proc.stderr.splitlines() if "PF050" in line]
    record = {
        "checks": {
            "refused with exit 2": proc.returncode == 2,
            "PF050 named": bool(refusal),
            "no rank started": not rank_logs,
        },
        "lines": [f"exit {proc.returncode} after {time.time() - started:.1f} s: {' '.join(refusal)[:300]}"],
        "seconds_to_refuse": time.time() - started,
    }
    if not all(record["checks"].values()):
        record["failure"] = failure_text(proc, out)
    return record


def _paths(s: Scenario, mode: Mode, work: Path, clock: Clock, done: dict) -> dict:
    """benchmarks/gpu_paths.py: the decisions underneath with torch, PEFT and bitsandbytes alone."""
    from benchmarks import gpu_paths

    os.environ["GPU_PATHS_DEVICE"] = mode.device
    gpu_paths.DEVICE = mode.device
    found = gpu_paths.run(timeout=clock.left())
    return {
        "checks": {k: v.startswith("ok") for k, v in found["checks"].items() if not v.startswith("skipped")}
        or {"ran": False},
        "lines": found["text"].splitlines(),
        "gpu_paths": found["checks"],
        **({} if found["ok"] else {"failure": found["text"]}),
    }
