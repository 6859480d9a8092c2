"""scripts/gpu_check.sh --cpu-smoke, bounded for CI: the GPU check's whole path on CPU (the plan, the probe with its
bounded device stages, every scenario's decisions beside the first run, the runs, the output folder, the verdict)
for the flagship QLoRA + cpu_offload flags, the FULL_STATE_DICT checkpoint (the adapter file alone) and resume, the
fp32-storage QLoRA (benchmarks/sweep.py counts on it running here) and the memory pre-flight's refusal against a
simulated H200. The whole --cpu-smoke is the rehearsal (DESIGN.md)."""

from __future__ import annotations

import json
import os
import subprocess

from tests.conftest import REPO

CI_SCENARIOS = "QLoRA FSDP2 + cpu_offload + sharded,FSDP2 + cpu_offload: FULL_STATE_DICT,memory pre-flight,fp32 storage"
RESUME = "LoRA FSDP2 + cpu_offload: FULL_STATE_DICT checkpoint then resume"
REFUSAL = "memory pre-flight refuses a run that cannot fit"
RAN = {"QLoRA FSDP2 + cpu_offload + sharded loading", RESUME, REFUSAL, "QLoRA fp32 storage under bf16"}


def test_gpu_check_cpu_smoke(model_cache, tmp_path) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, FSDP_TUNE_CACHE=str(model_cache), WHEELS_DIR=str(tmp_path / "no-wheels"))
    env.pop("OUT", None)
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--cpu-smoke", "--only", CI_SCENARIOS, "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    log = (out / "gpu_check.log").read_text() if (out / "gpu_check.log").exists() else proc.stdout
    failures = (out / "failures.log").read_text() if (out / "failures.log").exists() else ""
    assert proc.returncode == 0, log[-6000:] + proc.stderr[-3000:] + failures[-6000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_check.log",
        "probe.json",
        "scenarios.jsonl",
        "summary.json",
    ], failures[-6000:]  # failures.log only when something failed
    assert log.startswith("GPU check (--cpu-smoke): time budget 3600 s")
    assert log.index("what matters ends at") < log.index("versions:")  # the plan first
    probe = json.loads((out / "probe.json").read_text())
    assert probe["ok"] and probe["imports_checked"] > 50
    stages = {r["stage"]: r for r in probe["device_stages"]}
    assert list(stages) == ["context", "matmul", "pinned", "nccl", "bnb"] and all(r["ok"] for r in stages.values())
    assert stages["nccl"]["detail"].startswith("cpu:gloo: all-reduce") and "Linear4bit" in stages["bnb"]["detail"]
    decided = "\n".join(probe["decisions"])
    assert "LoRA FSDP1 NO_SHARD: FULL_STATE_DICT checkpoint unit by unit, then resume: cuda, FSDP1" in decided
    assert "save fsdp1_units" in decided and f"{REFUSAL}: refused before launch (PF050)" in decided
    records = {r["name"]: r for r in map(json.loads, (out / "scenarios.jsonl").read_text().splitlines())}
    assert {n for n, r in records.items() if r["status"] == "pass"} == RAN
    assert all(r["status"] == "skipped" for n, r in records.items() if n not in RAN)
    for name in RAN - {REFUSAL}:
        checks = records[name]["checks"]
        assert checks["trained, adapter checked whole"] and isinstance(records[name]["memory_ok"], bool), name
        assert (
            checks["loading path as decided, from the rank"]
            and checks["parameters where the spec put them, from the rank"]
        )
        assert "memory within 15% of the plan" not in checks  # on CPU printed, not counted (RSS)
        assert records[name]["tokens_per_s"] > 0 and "4N FLOPs/token" in records[name]["mfu_formula"]
        assert records[name]["estimate_s"] > 0 and records[name]["host_s"] > 0  # what the budget scales
    assert records["QLoRA FSDP2 + cpu_offload + sharded loading"]["loading"] == "sharded"
    resume = records[RESUME]["checks"]
    assert resume["resumed at step 2, losses as the straight run's"]
    assert resume["the checkpoint holds what the spec decided"]  # the adapter file, no accelerate model file
    assert records[REFUSAL]["checks"] == {"refused with exit 2": True, "PF050 named": True, "no rank started": True}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["pass"] == len(RAN) and summary["fail"] == 0
    assert summary["timing"]["decisions_s"] > 0 and summary["timing"]["decided"] > 10
    assert "verdict: PASS: 4 passed, 0 failed" in log


def test_gpu_paths_dry_run_on_cpu(monkeypatch) -> None:
    """benchmarks/gpu_paths.py (the GPU check's library-level half) runs its checks on CPU over gloo, so a GPU
    session never spends its minutes on this script's own bugs."""
    from benchmarks import gpu_paths

    monkeypatch.setattr(gpu_paths, "DEVICE", "cpu")
    monkeypatch.setenv("GPU_PATHS_DEVICE", "cpu")
    result = gpu_paths.run()
    assert result["ok"], result["text"]
    assert [v.split(" ")[0] for v in result["checks"].values()] == ["ok", "ok", "skipped:", "ok"]
