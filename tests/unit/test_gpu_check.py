"""The GPU check's own logic without a GPU or torch (issue #21): the time budget and what a run cut short leaves
in the output folder, the MFU formula, the memory verdict against the plan, the scenario cap that ends a whole
process group; and the rank side's spelling of the trainer arguments for the transformers on the lent machine."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks import gpu_check
from benchmarks.gpu_scenarios import FLAGSHIP, Mode, memory_check, mfu, run_group, scenarios


def _cpu_mode() -> Mode:
    return Mode("cpu", 0, "cpu", None, steps=4, warmup=1)


def test_order_puts_the_issue_items_first() -> None:
    names = [s.name for s in scenarios(1)]
    assert names[0] == FLAGSHIP and names[1] == "LoRA FSDP2"
    assert [s.kind for s in scenarios(1)][:7] == ["train", "train", "resume", "train", "train", "train", "refuse"]
    assert sum(s.est_s for s in scenarios(1)[:7]) + 45 <= gpu_check.BUDGET_S["cuda"]  # probe and build included


def test_out_of_budget_scenarios_are_skipped_by_name_and_recorded_as_they_go(tmp_path) -> None:
    """A budget already spent: nothing starts, and every file a cut-off run must leave is there, per scenario."""
    out = gpu_check.Out(tmp_path)
    plan = scenarios(1)
    results = gpu_check.run_all(out, _cpu_mode(), plan, None, budget=0.0, t0=time.time())
    assert all(r["status"] == "skipped" for r in results.values())
    assert results[FLAGSHIP]["why"].startswith("out of time")
    assert results["LoRA FSDP1 on one GPU (NO_SHARD)"]["why"] == "FSDP1 is GPU only (refused on CPU)"
    lines = (tmp_path / "scenarios.jsonl").read_text().splitlines()
    assert [json.loads(x)["name"] for x in lines] == [s.name for s in plan]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["finished"] and summary["skipped"] == len(plan) and summary["fail"] == 0
    assert "[1/15] " + FLAGSHIP in (tmp_path / "gpu_check.log").read_text()


def test_only_picks_scenarios_by_part_of_their_name() -> None:
    flagship = scenarios(1)[0]
    assert gpu_check.skip_reason(flagship, _cpu_mode(), "sharded loading,resume") is None
    assert gpu_check.skip_reason(flagship, _cpu_mode(), "FSDP1") == "not in --only"


def test_mfu_states_its_formula() -> None:
    h200 = Mode("cuda", 1, "NVIDIA H200", 143771, 8, 3)
    value, text = mfu(10_000.0, 1_000_000_000, True, h200, 1)
    assert value == pytest.approx(10_000 * 6e9 / 989e12)
    assert "6N FLOPs/token (4N forward + activation gradients, +2N recompute)" in text and "989 TFLOP/s" in text
    value, text = mfu(10_000.0, 1_000_000_000, False, h200, 1)
    assert value == pytest.approx(10_000 * 4e9 / 989e12) and text.count("4N") == 2
    assert mfu(10_000.0, 1_000_000_000, True, _cpu_mode(), 2)[0] is None


@pytest.mark.parametrize(
    "measured_mib,expected",
    [(1024 * 1.149, True), (1024 * 0.851, True), (1024 * 1.16, False), (1024 * 0.84, False)],
)
def test_memory_within_15_percent_of_the_plan(measured_mib: float, expected: bool) -> None:
    summary = {"per_rank": [{"peak_gpu_allocated_mib": measured_mib, "peak_rss_mib": 10.0}]}
    ok, line = memory_check(summary, {"peak_allocated_gib": 1.0}, on_cpu=False)
    assert ok is expected and ("PASS" if expected else "FAIL") in line
    rss = {"per_rank": [{"peak_rss_mib": measured_mib}, {"peak_rss_mib": 1.0}]}
    assert memory_check(rss, {"per_rank_host_peak_gib": 1.0}, on_cpu=True)[0] is expected  # the largest rank


def test_a_scenario_cap_ends_everything_it_started(tmp_path) -> None:
    """The cap ends the whole process group (fsdp-tune, torchrun and its ranks), not the first process alone."""
    child = tmp_path / "child.pid"
    script = f"import subprocess; p = subprocess.Popen(['sleep', '300']); open({str(child)!r}, 'w').write(str(p.pid))"
    done = run_group([sys.executable, "-c", script + "; p.wait()"], dict(os.environ), timeout=5)
    assert done.returncode == 124 and "cut at the scenario's cap" in done.stderr
    pid = int(child.read_text())
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    assert state in ("", "Z"), f"the grandchild {pid} survived the cap ({state})"


@dataclasses.dataclass
class _Config517:  # TrainingArguments' checkpointing fields in transformers 5.17
    output_dir: str = ""
    gradient_checkpointing: bool = False
    gradient_checkpointing_kwargs: dict | None = None


@dataclasses.dataclass
class _Config524:
    output_dir: str = ""
    activation_checkpointing: bool = False
    activation_checkpointing_kwargs: dict | None = None


def test_trainer_arguments_in_the_installed_transformers_spelling() -> None:
    """The spec speaks transformers 5.24 (activation_checkpointing); the lent machine's 5.17 calls it
    gradient_checkpointing: SFTConfig(activation_checkpointing=...) was a TypeError there (the CPU rehearsal)."""
    from fsdp_tune.worker.training.spelling import installed_names

    spec_args = {"output_dir": "x", "activation_checkpointing": True, "activation_checkpointing_kwargs": {"a": 1}}
    assert installed_names(dict(spec_args), _Config524) == spec_args
    old = installed_names(dict(spec_args), _Config517)
    assert old == {"output_dir": "x", "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"a": 1}}
    _Config517(**old)
    with pytest.raises(TypeError, match="takes no packing"):
        installed_names({"output_dir": "x", "packing": True}, _Config524)
