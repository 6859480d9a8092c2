"""scripts/gpu_check.sh --cpu-smoke: the GPU check's whole path (plan, LoRA and QLoRA runs, the table) on CPU."""

from __future__ import annotations

import json
import os
import subprocess

from tests.conftest import REPO


def test_gpu_check_cpu_smoke(model_cache) -> None:
    env = dict(os.environ, FSDP_TUNE_CACHE=str(model_cache))
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--cpu-smoke"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "LoRA FSDP2" in out.stdout and "QLoRA fp32 storage under bf16" in out.stdout and "FAILED" not in out.stdout
    results = json.loads((REPO / "benchmarks" / "results" / "gpu_check_cpu_smoke.json").read_text())
    assert set(results["scenarios"]) == {"LoRA FSDP2", "QLoRA fp32 storage under bf16"}
    for scenario in results["scenarios"].values():
        assert scenario["tokens_per_s"] > 0 and scenario["planned_gib"] > 0 and scenario["adapter_ok"]


def test_gpu_paths_dry_run_on_cpu(monkeypatch) -> None:
    """benchmarks/gpu_paths.py (the GPU check's library-level half) runs its checks on CPU over gloo, so a GPU
    session never spends its minutes on this script's own bugs."""
    from benchmarks import gpu_paths

    monkeypatch.setattr(gpu_paths, "DEVICE", "cpu")
    monkeypatch.setenv("GPU_PATHS_DEVICE", "cpu")
    result = gpu_paths.run()
    assert result["ok"], result["text"]
    assert [v.split(" ")[0] for v in result["checks"].values()] == ["ok", "ok", "skipped:", "ok"]
