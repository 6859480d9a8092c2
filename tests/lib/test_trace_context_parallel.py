"""`plan --trace` under context parallelism (#51): the traced step runs each micro-batch through transformers'
Trainer sharding and torch's context_parallel, its attention through torch's ring (K/V all-gathered, dK/dV sent
back), on a fake process group of 2 ranks with cp_size 2: Qwen3-8B's shape (the shipped reference config), LoRA,
1 x 4096 tokens, activation checkpointing with activation offload (TRL#6846's settings, small). One trace, shared:
its peak within the trace grid's tolerance of the plan (benchmarks/trace_grid.py TOLERANCE), the ring's bytes those
of each rank's half of the sequence, the checkpointed inputs in host memory. And the mask stand-in: no S x S
mask on fake tensors where real ones build none."""

from __future__ import annotations

import pytest

from benchmarks.trace_grid import TOLERANCE
from fsdp_tune.output.trace import compare, format_trace
from fsdp_tune.planner.plan import memory_plan
from fsdp_tune.validate import check

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.lib

SEQ, CP, LAYERS, KV, HIDDEN = 4096, 2, 36, 8 * 128, 4096  # Qwen3-8B: 36 layers, 8 K/V heads of 128
FLAGS = (
    "--model_name_or_path", "Qwen/Qwen3-8B", "--num_processes", "2", "--per_device_train_batch_size", "1",
    "--gradient_accumulation_steps", "1", "--fsdp_version", "2", "--fsdp_activation_checkpointing", "true",
    "--fsdp_activation_checkpointing_offload", "true", "--attn_implementation", "sdpa", "--use_peft_lora", "true",
    "--bf16", "true", "--max_seq_len", str(SEQ), "--use_parallelism_config", "true",
    "--parallelism_config_cp_size", str(CP),
)  # fmt: skip


@pytest.fixture(scope="module")
def traced() -> tuple[dict, dict]:
    from fsdp_tune.trace.run import trace

    checked = check(None, list(FLAGS))
    assert not checked.errors, checked.errors
    plan = memory_plan(checked.config, gpu_key="h100")
    result = trace(checked.config)
    result["comparison"] = compare(plan, result)
    return plan, result


def test_the_step_runs_torchs_ring_on_each_ranks_half_of_the_sequence(traced) -> None:
    """Per layer: the local K/V (SEQ / CP tokens, bf16) gathered from the other rank in the forward, the recompute and
    the backward; the fp32 dK/dV sent at each of the ring's 2 steps (_templated_ring_attention_backward). Bytes of
    the whole sequence's K/V would be twice these."""
    plan, result = traced
    assert result["mesh"] == {"cp_size": CP} and result["world_size"] == 2
    local = SEQ // CP
    per_layer = (CP - 1) * 3 * local * 2 * KV * 2 + CP * local * 2 * KV * 4
    assert result["comm_bytes_per_step"]["context-parallel ring"] == pytest.approx(LAYERS * per_layer, rel=1e-3)
    assert plan["step_time"]["ring_gb_per_step_per_gpu"] * 1e9 == pytest.approx(LAYERS * per_layer, rel=1e-3)
    text = format_trace(result)
    assert "mesh cp_size 2" in text and "torch's context_parallel" in text and "the ring: plan" in text


def test_the_traced_peak_is_the_plans_within_the_trace_grids_tolerance(traced) -> None:
    plan, result = traced
    c = result["comparison"]
    assert abs(c["peak_difference"]) <= TOLERANCE, c
    assert result["peak_phase"].startswith("backward"), result["peak_phase"]


def test_activation_offload_keeps_every_layers_checkpointed_input_in_host_memory(traced) -> None:
    """save_on_cpu's copies: each layer's input (SEQ / CP local tokens x 4096 x bf16), none of them on the device."""
    _, result = traced
    assert result["host_activations_gib"] == pytest.approx(LAYERS * (SEQ // CP) * HIDDEN * 2 / 2**30, rel=0.01)
    assert result["comparison"]["host_activations_difference"] == pytest.approx(0, abs=0.01)
    host = f"{LAYERS * (SEQ // CP) * HIDDEN * 2 / 2**30:.2f} GiB"
    assert f"host memory: {host} of checkpointed activations (save_on_cpu); plan {host}" in format_trace(result)


def test_fake_tensors_build_no_attention_mask_where_real_full_rows_build_none() -> None:
    """transformers skips the S x S mask for an all-ones 2-D mask (SDPA's is_causal), but takes any FakeTensor for
    a traced graph and builds it: at 1M tokens (131072 a rank under cp 8) that is 16 GiB the GPU never holds. The
    stand-in decides on the all-ones mask's values, as real tensors do."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoConfig
    from transformers.masking_utils import create_causal_mask

    from fsdp_tune.trace.standins import cuda_paths

    config = AutoConfig.for_model("qwen3", hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    config._attn_implementation = "sdpa"
    n = 2048

    def mask():
        args = torch.empty(1, n, 64), torch.ones(1, n, dtype=torch.long), None, torch.arange(n)[None]
        return create_causal_mask(config, *args)

    assert mask() is None  # real tensors
    with FakeTensorMode():
        built = mask()
        with cuda_paths():
            skipped = mask()
    assert built is not None and tuple(built.shape) == (1, 1, n, n)
    assert skipped is None
