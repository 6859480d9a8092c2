"""The GPU check's other kinds of scenario (benchmarks/gpu_runs.py runs the training ones): a checkpoint then a
resume of a copy of it, the memory pre-flight's refusal, and benchmarks/gpu_paths.py."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from benchmarks import gpu_criteria as crit
from benchmarks.gpu_proc import cli, failure_text, stand_in_nvidia_smi
from benchmarks.gpu_runs import Clock, add, failed, measures, one, steps_seconds
from benchmarks.gpu_scenarios import Mode, Scenario, args_for


def resume(s: Scenario, mode: Mode, work: Path, clock: Clock, done: dict, extra=()) -> dict:
    """Save every k steps over 2k; resume a copy of checkpoint k: steps k+1..2k must match the straight run's, and
    the checkpoint must be what the spec decided it holds (RankSpec.save.checkpoint)."""
    k = max(mode.steps // 2, 2)
    saving = ("--save_strategy", "steps", "--save_steps", str(k), *extra)
    straight = one(s, mode, work / "straight", clock, 2 * k, saving)
    if not straight["ok"]:
        return failed(straight, "trained with checkpoints")
    record = measures(s, mode, straight)
    add(record, "the checkpoint holds what the spec decided", checkpoint_files(work / "straight", k, straight))
    target = work / "resumed"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(work / "straight" / f"checkpoint-{k}", target / f"checkpoint-{k}")
    resumed = one(s, mode, target, clock, 2 * k, (*saving, "--resume_from_checkpoint", "latest"))
    record["steps_s"] = round(record["steps_s"] + steps_seconds(resumed.get("metrics") or []), 2)
    if not resumed["ok"]:
        gone = failed(resumed, "resumed from the checkpoint")
        record["checks"].update(gone["checks"])
        record["lines"] += gone["lines"]
        record["failure"] = gone["failure"]
        return record
    after = {m["step"]: m["loss"] for m in straight["metrics"] if "loss" in m and m.get("step", 0) > k}
    again = {m["step"]: m["loss"] for m in resumed["metrics"] if "loss" in m and m.get("step", 0) > k}
    steps = sorted(after)
    ok, line = crit.same_losses(
        [again.get(i, float("inf")) for i in steps],
        [after[i] for i in steps],
        crit.LOSS_TOLERANCE[mode.device],
        "the straight run",
    )
    record["checks"][f"resumed at step {k}, losses as the straight run's"] = bool(ok) and set(again) == set(after)
    record["lines"].append(f"resumed from checkpoint-{k}, steps {steps}: {line}")
    add(record, "resumed run's adapter checked whole", crit.adapter_whole(resumed["summary"]))
    return record


def checkpoint_files(run: Path, step: int, got: dict) -> tuple[bool, str]:
    """ "adapter_file": the adapter file and no accelerate model file (pytorch_model_fsdp.bin, the whole-model
    gather under FSDP1); "accelerate": accelerate's shards (SHARDED) or model file."""
    decided = ((got["resolved"].get("spec") or {}).get("save") or {}).get("checkpoint")
    folder = run / f"checkpoint-{step}"
    adapter, bin_file = (folder / "adapter_model.safetensors").is_file(), (folder / "pytorch_model_fsdp.bin").exists()
    ok = adapter and not bin_file if decided == "adapter_file" else decided == "accelerate"
    return ok, (
        f"checkpoint-{step}: save.checkpoint {decided!r}; adapter_model.safetensors {'there' if adapter else 'absent'},"
        f" pytorch_model_fsdp.bin {'there' if bin_file else 'absent'}: {'PASS' if ok else 'FAIL'}"
    )


def refuse(s: Scenario, mode: Mode, work: Path, clock: Clock, done: dict, extra=()) -> dict:
    """The launcher refuses (exit 2, PF050) before any process starts: no rank log, nothing built."""
    out = work / "run"
    env = mode.env
    if mode.device == "cpu":  # the same command against a simulated H200: a stand-in nvidia-smi first on the PATH
        env = {**env, "PATH": f"{stand_in_nvidia_smi(work / 'bin')}{os.pathsep}{env.get('PATH', '')}"}
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


def paths(s: Scenario, mode: Mode, work: Path, clock: Clock, done: dict, extra=()) -> dict:
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


KINDS = {"resume": resume, "refuse": refuse, "paths": paths}
