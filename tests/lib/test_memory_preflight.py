"""train's memory pre-flight on GPU machines (preflight/memory.py), with simulated machines: the run planned on
the GPUs it will use, refused (PF050) when its peak does not fit the smallest, naming the phase, the figures and
the cheapest change that fits. Library layer: the planner counts parameters with torch on the meta device."""

from __future__ import annotations

import pytest

from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.rank import decide
from fsdp_tune.launch.train import plan_run
from fsdp_tune.preflight.memory import check_memory, ranks_gpus
from fsdp_tune.validate import check
from tests.conftest import REPO, seed_flags

RTX4090 = "NVIDIA GeForce RTX 4090"
TWO_4090 = Machine(cuda=True, gpus=2, gpu_names=(RTX4090,) * 2, driver_version="560.1.1", gpu_memory_mib=(24564,) * 2)
H100_MIXED = Machine(
    cuda=True,
    gpus=2,
    gpu_names=("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"),
    driver_version="560.1.1",
    gpu_memory_mib=(81559, 40960),
)


def _findings(machine: Machine, *extra: str, script: str = "run_peft_qlora_fsdp.sh"):
    config, flags = seed_flags(script)
    cfg = check(str(REPO / config), [*flags, *extra]).config
    return check_memory(cfg, decide(cfg, machine), machine)


@pytest.mark.parametrize(
    "name,machine,extra,expected",
    [
        ("the seed's QLoRA as launched (FSDP2, sharded) on 2 x 24 GB fits", TWO_4090, (), set()),
        ("as FSDP1 it loads the whole 4-bit model on each card", TWO_4090, ("--fsdp_version", "1"), {"error"}),
        ("--skip_memory_check launches anyway", TWO_4090, ("--fsdp_version", "1", "--skip_memory_check"), set()),
        ("no offload: 31.7 GiB on 24 GB", TWO_4090, ("--fsdp_offload_params", "false"), {"error"}),
        ("a CPU run is not checked", TWO_4090, ("--fsdp_version", "1", "--use_cpu", "true"), set()),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_memory_preflight_table(name: str, machine: Machine, extra: tuple, expected: set) -> None:
    found = _findings(machine, *extra)
    assert {f.severity.value for f in found if f.rule == "PF050"} == expected, found


def test_refusal_names_phase_figures_card_and_the_cheapest_fix() -> None:
    (f,) = _findings(TWO_4090, "--fsdp_version", "1")
    assert "loading (before FSDP shards the model)" in f.message and "24.0 GiB NVIDIA GeForce RTX 4090" in f.message
    assert "the smallest of 2 GPUs" in f.message
    assert f.hint.startswith("--fsdp_version 2 (plans ") and "--skip_memory_check" in f.hint


def test_the_smallest_card_the_ranks_use_decides() -> None:
    """A 40 GB A100 beside an 80 GB H100: the A100 decides; hidden by CUDA_VISIBLE_DEVICES, the H100 alone."""
    config, flags = seed_flags("run_peft_qlora_fsdp.sh")
    extra = ["--fsdp_offload_params", "false", "--num_processes", "1"]
    cfg = check(str(REPO / config), [*flags, *extra]).config
    both = decide(cfg, H100_MIXED)
    assert ranks_gpus(both, H100_MIXED) == [("NVIDIA H100 80GB HBM3", 81559)]  # one rank: the first GPU
    cfg2 = check(str(REPO / config), [*flags, "--fsdp_offload_params", "false"]).config
    spec2 = decide(cfg2, H100_MIXED)
    assert min(ranks_gpus(spec2, H100_MIXED), key=lambda g: g[1])[1] == 40960
    hidden = Machine(**{**H100_MIXED.__dict__, "cuda_visible_devices": "1"})
    assert ranks_gpus(decide(cfg, hidden), hidden) == [("NVIDIA A100-SXM4-40GB", 40960)]


def test_train_refuses_before_launch(tmp_path) -> None:
    """Through train's planning (what `train` runs before any process starts): PF050 among the machine findings."""
    config, flags = seed_flags("run_peft_qlora_fsdp.sh")
    out = ["--output_dir", str(tmp_path / "run"), "--fsdp_version", "1"]
    planned = plan_run(str(REPO / config), [*flags, *out], lambda _: None, machine=TWO_4090)
    assert "PF050" in {f.rule for f in planned.machine_findings if f.severity.value == "error"}


def test_at_capacity_warning_names_the_flags_that_leave_room() -> None:
    """8B QLoRA at micro-batch 8 x 4096 on 2 x 24 GB fits only at the card's capacity: the warning gives the
    cheapest complete flags that leave the allocator room (#25.4; it said only `fsdp-tune plan`)."""
    eight_b = ("--model_name_or_path", "meta-llama/Meta-Llama-3-8B", "--per_device_train_batch_size", "8")
    (f,) = _findings(TWO_4090, *eight_b, "--max_seq_len", "4096")
    assert f.severity.value == "warning" and "at the card's capacity" in f.message
    assert f.hint.startswith("--per_device_train_batch_size 4 --gradient_accumulation_steps 4 (plans ")
