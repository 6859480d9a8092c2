"""LoRA and QLoRA under FSDP2 on this machine's GPUs (one rank per GPU, two at most), through `fsdp-tune train`
as a user runs it: the ranks compute on CUDA over NCCL, load the model sharded in bf16, train, and save an
adapter that is whole and trained."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, offline_env

GPU_FLAGS = ("--use_cpu", "false", "--bf16", "True", "--max_steps", "4")
QLORA = ("--use_4bit_quantization", "True", "--bnb_4bit_quant_storage_dtype", "bfloat16")
QLORA += ("--bnb_4bit_compute_dtype", "bfloat16")


@pytest.mark.parametrize("extra", [(), QLORA], ids=["LoRA", "QLoRA"])
def test_fsdp2_trains_on_the_gpus(extra, tmp_path, model_cache) -> None:
    import torch

    ranks = min(torch.cuda.device_count(), 2)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fsdp_tune", "train", "--config", str(FIXTURES / "tiny_lora.yaml")]
    cmd += [*GPU_FLAGS, *extra, "--num_processes", str(ranks), "--output_dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=offline_env(model_cache))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "GPU, nccl" in proc.stdout  # the plan: the ranks compute on CUDA
    summary = json.loads((out / "fsdp_tune_summary.json").read_text())
    assert summary["adapter_check"]["ok"] and summary["loss_last"] < summary["loss_first"], summary["losses"]
    assert summary["extra"]["loading"]["path"] == "sharded"  # each rank read only its shards
    assert all(r["peak_gpu_allocated_mib"] for r in summary["per_rank"])
