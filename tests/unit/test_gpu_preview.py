"""`train --dry_run --gpu KEY [--gpus N]` (#25.8): a GPU node as data (decide/simulate.py), decided like any machine;
refused without --dry_run. The console itself (its memory plan needs torch) is in tests/lib/test_dry_run.py."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.decide import simulate
from fsdp_tune.decide.rank import decide
from fsdp_tune.launch.torchrun import torchrun_args
from fsdp_tune.preflight.memory import gpu_key
from fsdp_tune.validate import check
from tests.conftest import FIXTURES

runner = CliRunner()
BASE = str(FIXTURES / "tiny_lora.yaml")


@pytest.mark.parametrize("args", [("--gpu", "h100"), ("--gpu", "h100", "--gpus", "8"), ("--gpus", "8", "--dry_run")])
def test_a_simulated_node_is_refused_outside_a_dry_run(args: tuple, tmp_path) -> None:
    r = runner.invoke(app, ["train", "--config", BASE, "--output_dir", str(tmp_path / "o"), *args])
    assert r.exit_code == 2, r.output
    assert "only a dry run can use it" in r.output or "--gpus needs --gpu" in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("key", sorted(simulate.NVIDIA_NAMES))
def test_the_node_names_its_cards_as_nvidia_smi_does_so_the_memory_check_plans_them(key: str) -> None:
    node = simulate.gpu_node(key, 4)
    assert node.cuda and node.gpus == 4 and len(node.gpu_memory_mib) == 4
    assert gpu_key(node.gpu_names[0]) == key


def test_the_rank_spec_is_a_gpu_nodes() -> None:
    cfg = check(BASE, ["--num_processes", "8", "--use_cpu", "false"]).config
    spec = decide(cfg, simulate.gpu_node("h100", 8))
    assert spec.device == "cuda" and spec.backend == "nccl" and spec.world.nproc_per_node == 8
    assert "--nproc_per_node=8" in torchrun_args(spec)


def test_unknown_gpu_and_empty_node_are_usage_errors() -> None:
    from fsdp_tune.errors import UsageError

    with pytest.raises(UsageError, match="--gpu v100: unknown"):
        simulate.gpu_node("v100", 8)
    with pytest.raises(UsageError, match="at least one GPU"):
        simulate.gpu_node("h100", 0)
