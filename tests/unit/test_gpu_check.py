"""The GPU check's own logic without a GPU or torch (issues #21, #31): the order, the budget derived from the
recorded rehearsal and inside 7 minutes, what a run cut short leaves in the output folder, the verdict table read
from it, the probe's bounded device stages (a hang is reported and the rest go on), the cap that ends a whole
process group; and the rank side's spelling of the trainer arguments for the transformers on the lent machine."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks import gpu_budget, gpu_check, gpu_verdict
from benchmarks.gpu_cuda_probe import run_stages
from benchmarks.gpu_proc import run_group
from benchmarks.gpu_scenarios import CPU_RUN, FLAGSHIP, GRPO, PATHS, THROUGHPUT, VISION, Mode, scenarios


def _cpu_mode() -> Mode:
    return Mode("cpu", 0, "cpu", None, steps=4, warmup=1)


def test_order_by_what_a_gpu_minute_answers() -> None:
    names = [s.name for s in scenarios(1)]
    # the probe runs before all of them; GRPO and vision next: the paths the image's transformers 5.17 could break
    assert names[:5] == [PATHS, FLAGSHIP, GRPO, VISION, THROUGHPUT]
    last = [s.name for s in scenarios(1) if s.min_gpus == 1][-4:]
    assert last[:2] == [CPU_RUN, "memory pre-flight refuses a run that cannot fit"]
    assert not any(s.matters for s in scenarios(1) if s.name in last[2:])  # the duplicate offload run, the 1B MFU


def test_what_matters_fits_seven_minutes_at_the_recorded_rehearsals_scaled_estimates() -> None:
    """The estimates come from the recorded rehearsal (benchmarks/data/gpu_check_rehearsal.json), scaled as the
    check scales them; every scenario that matters on one H200 ends inside the 450 s budget (420 s before GRPO and
    vision joined: their estimates are the default host work until a rehearsal records them)."""
    rehearsal = gpu_budget.load_rehearsal()
    assert rehearsal["scenarios"], "no rehearsal recorded: python -m benchmarks.gpu_budget record OUT"
    plan = scenarios(1)
    line = gpu_budget.timeline(plan, gpu_budget.h200(), rehearsal, lambda s: s.min_gpus <= 1)
    assert line["matters_end"] <= gpu_budget.BUDGET_S["cuda"] == 450
    by_name = {r["name"]: r for r in line["rows"]}
    assert all(by_name[s.name]["parts"]["host"] > 0 for s in plan if s.min_gpus <= 1)  # from the rehearsal
    assert by_name[THROUGHPUT]["start"] >= line["builds"]["builtin:llama3-8b"]  # waits for its model
    text = "\n".join(gpu_budget.plan_lines(plan, gpu_budget.h200(), 450, rehearsal, lambda s: s.min_gpus <= 1))
    assert gpu_budget.ASSUMPTIONS in text and "what matters ends at" in text


def test_an_estimate_is_the_rehearsal_scaled() -> None:
    s = next(x for x in scenarios(1) if x.name == FLAGSHIP)
    rehearsal = {"scenarios": {FLAGSHIP: {"seconds": 30.0, "steps_s": 10.0, "host_s": 20.0}}}
    got = gpu_budget.estimate(s, gpu_budget.h200(), rehearsal)
    assert got["parts"]["host"] == pytest.approx(gpu_budget.HOST_SPEED * 20.0)  # the speed when none is given
    assert got["parts"]["cuda_start"] == gpu_budget.CUDA_START_S
    assert got["seconds"] == pytest.approx(sum(got["parts"].values()), abs=0.2)
    assert gpu_budget.estimate(s, _cpu_mode(), rehearsal)["seconds"] == 30.0  # on CPU: the rehearsal itself
    assert gpu_budget.llama_params("builtin:llama3-8b") == 8_030_261_248  # Llama-3-8B's count


def test_out_of_budget_scenarios_are_skipped_by_name_and_recorded_as_they_go(tmp_path) -> None:
    """A budget already spent: nothing starts, and every file a cut-off run must leave is there, per scenario; the
    verdict table reads them."""
    out = gpu_check.Out(tmp_path)
    plan = scenarios(1)
    ctx = {"rehearsal": {"scenarios": {}}, "timing": {}}
    results = gpu_check.run_all(out, _cpu_mode(), plan, None, budget=0.0, t0=time.time(), ctx=ctx)
    assert all(r["status"] == "skipped" for r in results.values())
    assert results[FLAGSHIP]["why"].startswith("out of time")
    fsdp1 = [r for r in results.values() if "FSDP1" in r["name"]]
    assert fsdp1 and all(r["why"] == "FSDP1 is GPU only (refused on CPU)" for r in fsdp1)
    lines = (tmp_path / "scenarios.jsonl").read_text().splitlines()
    assert [json.loads(x)["name"] for x in lines] == [s.name for s in plan]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["finished"] and summary["skipped"] == len(plan) and summary["fail"] == 0
    assert f"[2/{len(plan)}] " + FLAGSHIP in (tmp_path / "gpu_check.log").read_text()
    table = gpu_verdict.table(tmp_path)
    assert table[-1].startswith("verdict: FAIL") and "no probe.json" in "\n".join(table)  # no probe: no pass


def test_the_verdict_names_each_failed_check_and_the_figures(tmp_path) -> None:
    (tmp_path / "probe.json").write_text(json.dumps({"ok": True, "seconds": 30, "device_stages": []}))
    rows = [
        {"name": FLAGSHIP, "status": "pass", "seconds": 40, "estimate_s": 35, "checks": {"trained": True}},
        {
            "name": THROUGHPUT,
            "kind": "throughput",
            "status": "fail",
            "seconds": 90,
            "estimate_s": 80,
            "tokens_per_s": 11000.0,
            "mfu": 0.357,
            "mfu_formula": "11,000 tok/s x 4N",
            "checks": {"trained": True, "steady over the timed steps": False},
            "goals": {"MFU at 4N at least 40%": False},
            "lines": ["steady: 20 timed steps: FAIL", "NeMo AutoModel ...: 12,473 tok/s"],
        },
    ]
    (tmp_path / "scenarios.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({"finished": True, "elapsed_s": 300, "budget_s": 420}))
    text = "\n".join(gpu_verdict.table(tmp_path))
    assert f"{THROUGHPUT}: steady over the timed steps" in text and "35.7%" in text and "11,000" in text
    assert "goal NOT met: MFU at 4N at least 40%" in text and "NeMo AutoModel" in text
    assert text.splitlines()[-1].startswith("verdict: FAIL: 1 passed, 1 failed")
    assert gpu_verdict.main([str(tmp_path)]) == 1


def test_only_picks_scenarios_by_part_of_their_name() -> None:
    flagship = scenarios(1)[1]
    assert gpu_check.skip_reason(flagship, _cpu_mode(), "sharded loading,resume") is None
    assert gpu_check.skip_reason(flagship, _cpu_mode(), "FSDP1") == "not in --only"


def test_a_device_stage_that_hangs_is_reported_and_the_rest_go_on() -> None:
    """The probe's device stages in processes of their own: one that hangs is ended at its bound and named; the
    stages after it run in a new process; one that crashes is named with its last words."""
    fake = (
        "import json, sys, time\n"
        "for name in sys.argv[2:]:\n"
        "    print(json.dumps({'stage': name, 'event': 'start'}), flush=True)\n"
        "    if name == 'pinned': time.sleep(60)\n"
        "    if name == 'nccl': sys.exit('NCCL error: unhandled system error')\n"
        "    end = {'stage': name, 'event': 'end', 'ok': True, 'seconds': 0.0, 'detail': 'fine'}\n"
        "    print(json.dumps(end), flush=True)\n"
    )
    started = time.time()
    found = run_stages("cuda", cap_s=3.0, cmd=[sys.executable, "-c", fake])
    assert time.time() - started < 30
    by = {f["stage"]: f for f in found}
    assert [f["stage"] for f in found] == ["context", "matmul", "pinned", "nccl", "bnb"]
    assert by["context"]["ok"] and by["matmul"]["ok"] and by["bnb"]["ok"]
    assert not by["pinned"]["ok"] and by["pinned"]["detail"].startswith("hung: no answer in 3 s")
    assert not by["nccl"]["ok"] and "NCCL error" in by["nccl"]["detail"]


def test_no_cuda_context_runs_nothing_that_needs_one() -> None:
    fake = 'import sys\nprint(\'{"stage": "context", "event": "start"}\', flush=True)\nsys.exit(\'no driver\')\n'
    found = run_stages("cuda", cap_s=5.0, cmd=[sys.executable, "-c", fake])
    assert [f["ok"] for f in found] == [False] * 5 and found[1]["detail"] == "not run: no CUDA context"


def test_a_scenario_cap_ends_everything_it_started(tmp_path) -> None:
    """The cap ends the whole process group (fsdp-tune, torchrun and its ranks), not the first process alone."""
    child = tmp_path / "child.pid"
    script = f"import subprocess; p = subprocess.Popen(['sleep', '300']); open({str(child)!r}, 'w').write(str(p.pid))"
    done = run_group([sys.executable, "-c", script + "; p.wait()"], dict(os.environ), timeout=5)
    assert done.returncode == 124 and "cut at the scenario's cap" in done.stderr
    pid = int(child.read_text())
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    # ps adds flags after the state letter (ZN under nice): a zombie is Z whatever follows
    assert state[:1] in ("", "Z"), f"the grandchild {pid} survived the cap ({state})"


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


def test_flags_added_on_the_machine_replace_the_scenarios_own() -> None:
    """Scenario.if_refused and the resume's saving flags replace a value the command already has (never a flag
    given twice)."""
    from benchmarks.gpu_scenarios import with_flags

    args = ["--config", "c.yaml", "--fsdp_activation_checkpointing", "false", "--max_steps", "8"]
    got = with_flags(args, ("--fsdp_activation_checkpointing", "true", "--save_steps", "4"))
    assert got == ["--config", "c.yaml", "--fsdp_activation_checkpointing", "true", "--max_steps", "8"] + [
        "--save_steps",
        "4",
    ]
