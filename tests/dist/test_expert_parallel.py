"""Expert parallelism with LoRA through transformers' own distributed loading, on 2 CPU ranks, in one launch of
scripts/ep_lora_experiment.py: what trains, what fails and where (the reasons fsdp-tune's rules give), and the run
at ep_size 2 against the same run at ep_size 1 (FSDP alone) from the same seed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, offline_env
from tests.dist.conftest import TIMEOUT

CASES = ["experts_after:ep=2", "attn_after:ep=2", "attn_sharded:ep=2", "attn_sharded:ep=1", "attn_all_after:tp=2"]
REL_TOL = 1e-5  # float32 on CPU; measured: equal to print precision


@pytest.fixture(scope="module")
def cases(tmp_path_factory, model_cache) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("ep")
    out = root / "cases.json"
    env = dict(offline_env(model_cache), PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    script = str(REPO / "scripts" / "ep_lora_experiment.py")
    proc = subprocess.run(
        [*cmd, script, "qwen3_moe", str(out), *CASES], capture_output=True, text=True, timeout=TIMEOUT, env=env
    )
    assert proc.returncode == 0 and out.exists(), proc.stderr[-6000:]
    return {r["case"]: r for r in json.loads(out.read_text())}


def test_lora_sharded_by_fsdp_trains_the_same_run_at_ep_2_and_1(cases) -> None:
    ep2, ep1 = cases["attn_sharded:ep=2"], cases["attn_sharded:ep=1"]
    assert ep2["ok"] and ep1["ok"], (ep2, ep1)
    assert len(ep2["losses"]) == len(ep1["losses"]) == 3
    for step, (a, b) in enumerate(zip(ep2["losses"], ep1["losses"], strict=True)):
        assert math.isclose(a, b, rel_tol=REL_TOL), (step, a, b)
    assert ep2["adapter_same_on_ranks"] and ep2["param_types"] == ["DTensor"]
    assert ep2["losses"][-1] != ep2["losses"][0]  # it trained


def test_lora_attached_after_the_sharded_load_diverges_across_ranks(cases) -> None:
    after = cases["attn_after:ep=2"]
    assert after["ok"] and not after["adapter_same_on_ranks"]  # transformers#48792: each rank its own adapter


def test_lora_on_experts_fails_where_the_rule_says(cases) -> None:
    """FT140's reason; when a library release makes this pass, the refusal goes."""
    experts = cases["experts_after:ep=2"]
    assert not experts["ok"] and "mixed torch.Tensor and DTensor" in experts["error"], experts
    assert any(f.startswith("peft/tuners/lora/layer.py") and "forward" in f for f in experts["frames"][-1:])


def test_lora_on_row_parallel_layers_fails_under_tp(cases) -> None:
    """FT035's reason, re-checked at transformers 5.24 and peft 0.21."""
    tp = cases["attn_all_after:tp=2"]
    assert not tp["ok"] and "is invalid for input of size" in tp["error"], tp
    assert any("transformers/distributed/tensor_parallel.py" in f for f in tp["frames"])
    assert any(f.startswith("peft/tuners/lora/layer.py") for f in tp["frames"])
