"""The planner against published measurements (PEFT's FSDP guide) and against RSS measured here."""

from __future__ import annotations

import pytest

from fsdp_tune.planner.plan import memory_plan
from fsdp_tune.validate import check
from tests.conftest import FIXTURES, REPO, seed_flags

pytestmark = pytest.mark.dist


def _seed(script: str, *extra: str):
    config, flags = seed_flags(script)
    return check(str(REPO / config), [*flags, *extra]).config


def test_exact_parameter_counts() -> None:
    plan = memory_plan(_seed("run_peft_fsdp.sh"))
    assert plan["total_params"] == 68_976_648_192  # Llama-2-70B, as published
    # LoRA r=8 on all 7 linears of 80 layers: 8 * sum(in + out)
    assert plan["trainable_params"] == 80 * 8 * (2 * (8192 + 8192) + 2 * (8192 + 1024) + 3 * (8192 + 28672))


def test_llama2_70b_lora_8_gpus() -> None:
    """PEFT FSDP guide: Llama-2-70B LoRA r=8 all-linear, 8x H100 80GB, seq 2048, micro-batch 8, gradient
    checkpointing: 72-80 GB per GPU (90-98%). nvidia-smi reports MiB, so the figure is read as GiB."""
    gib = memory_plan(_seed("run_peft_fsdp.sh"))["per_gpu_memory_gib"]
    assert 72 * 0.85 <= gib <= 80 * 1.15, gib


def test_llama2_70b_qlora_2_gpus_without_offload() -> None:
    """PEFT FSDP guide: Llama-2-70B QLoRA (nested, bf16 storage), 2 GPUs, seq 2048, micro-batch 2: 35.6 GB."""
    gib = memory_plan(_seed("run_peft_qlora_fsdp.sh", "--fsdp_offload_params", "false"))["per_gpu_memory_gib"]
    assert gib == pytest.approx(35.6, rel=0.15)


def test_llama2_70b_qlora_2_gpus_with_offload() -> None:
    """PEFT FSDP guide: the same with CPU offload: 19.6 GB per GPU and "around 107 GB" host RAM.

    The guide does not say when the host figure was read. The planner reports the peak (the first step,
    when FSDP1 holds the unpinned shards beside their pinned copies and pinned gradient buffers) and the
    steady state after it: the published figure must lie between them, and the peak within 15% of it."""
    plan = memory_plan(_seed("run_peft_qlora_fsdp.sh"))
    assert plan["per_gpu_memory_gib"] == pytest.approx(19.6, rel=0.15)
    assert plan["host_memory_gib_per_node"] == pytest.approx(107, rel=0.15)
    assert plan["host_memory_gib_per_node_steady"] < 107 < plan["host_memory_gib_per_node"]


def test_quantization_state_is_not_sharded_and_fsdp2_offloads_no_frozen_grads() -> None:
    two = memory_plan(_seed("run_peft_qlora_fsdp.sh", "--fsdp_offload_params", "false"))
    four = memory_plan(_seed("run_peft_qlora_fsdp.sh", "--fsdp_offload_params", "false", "--num_processes", "4"))
    # bitsandbytes keeps absmax on the module, outside FSDP: every rank holds all of it (~1 GiB for 70B, nested)
    key = "4-bit quantization constants (not sharded)"
    assert two["components"][key] == four["components"][key] == pytest.approx(1.01, abs=0.01)
    assert four["components"]["sharded base weights"] == pytest.approx(
        two["components"]["sharded base weights"] / 2, abs=0.001
    )
    fsdp1 = memory_plan(_seed("run_peft_qlora_fsdp.sh"))
    fsdp2 = memory_plan(_seed("run_peft_qlora_fsdp.sh", "--fsdp_version", "2"))
    assert "training: offloaded grads (pinned, every unit)" in fsdp1["host_components"]
    assert "training: offloaded grads (pinned, every unit)" not in fsdp2["host_components"]
    assert fsdp2["host_memory_gib_per_node"] < fsdp1["host_memory_gib_per_node"] - 40


def test_offload_moves_weights_to_host_and_advice_makes_it_fit() -> None:
    on = memory_plan(_seed("run_peft_qlora_fsdp.sh"))
    off = memory_plan(_seed("run_peft_qlora_fsdp.sh", "--fsdp_offload_params", "false"))
    assert on["per_gpu_memory_gib"] < off["per_gpu_memory_gib"] - 10
    assert on["host_memory_gib_per_node"] > off["host_memory_gib_per_node"] + 30
    # each all-gather first copies the local shard host -> GPU: 36.6 GB of 4-bit weights / 2 ranks x 4 gathers
    assert on["step_time"]["host_transfer_gb_per_step_per_gpu"] == pytest.approx(73.1, rel=0.01)
    assert off["step_time"]["host_transfer_gb_per_step_per_gpu"] == 0
    tight = memory_plan(_seed("run_peft_qlora_fsdp.sh", "--fsdp_offload_params", "false"), gpu_memory="24GiB")
    assert not tight["fits"] and tight["advice"]
    assert all(a["per_gpu_memory_gib"] <= 24 for a in tight["advice"])


def test_cpu_prediction_matches_measured_rss(train, tmp_path) -> None:
    """The demo-sized model and a 125M-parameter one on 2 CPU ranks: predicted peak RSS within 20%."""
    for i, flags in enumerate(((), ("--model_name_or_path", "builtin:small-llama", "--max_seq_len", "128"))):
        cfg = check(str(FIXTURES / "tiny_lora.yaml"), list(flags)).config
        predicted = memory_plan(cfg, on_cpu=True)["per_rank_host_peak_gib"] * 1024
        run = train(*flags, "--max_steps", "2", output_dir=tmp_path / f"run{i}")
        for rank in run.summary["per_rank"]:
            assert rank["peak_rss_mib"] == pytest.approx(predicted, rel=0.20), (flags, predicted, run.summary)
