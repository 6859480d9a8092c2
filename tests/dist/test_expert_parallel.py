"""Expert parallelism with LoRA through transformers' own distributed loading, on 2 CPU ranks, in two launches:

- one of scripts/ep_lora_experiment.py: what the libraries do with LoRA on a model sharded at load, and where it fails
  (the reasons FT140 and FT035 give);
- one group launch of fsdp-tune's own runs (planned as `train` plans them): tiny Qwen3-MoE and Mixtral (4 experts,
  top-2) at ep_size 2 against the same run at ep_size 1 (FSDP2 alone) from the same seed, step by step, and a run
  whose experts were copied from rank 0 (transformers#45662's wrong mesh), which the self-check stops in one line;
  in the same launch, a Qwen3-MoE ep_size 2 run checkpointed every 2 of 4 steps, the same run stopped after step 1
  by the stop file (the preemption path: a checkpoint on stop) and a third resumed from that checkpoint; and Mixtral's
  expert LoRA (no expert parallelism) checkpointed every 2 of 4 steps and resumed from checkpoint-2 (a launch of two
  runs of its own cost ~20 CPU-s of start-up more; how `train` resolves `latest` and says the resume on its console:
  tests/dist/conftest.py `continued`, test_preemption.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, offline_env
from tests.dist.conftest import TIMEOUT, launch_group
from tests.dist.families import build_all

CASES = ["experts_after:ep=2", "attn_after:ep=2", "attn_reduced:ep=2", "attn_all_after:tp=2"]
REL_TOL = 1e-6  # float32 on CPU; measured: the losses and the adapters are equal, bit for bit
EP2 = ("--use_parallelism_config", "true", "--ep_size", "2")
RUN = ("--lora_target_modules", "q_proj,k_proj,v_proj,o_proj", "--max_steps", "3")
COPIED = "qwen3_moe ep2 copied experts"
SAVED = (*RUN[:2], "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2", *EP2)
STRAIGHT, STOPPED, RESUMED = "qwen3_moe ep2 saved", "qwen3_moe ep2 stopped", "qwen3_moe ep2 resumed"
MOE_STRAIGHT, MOE_RESUMED = "mixtral experts saved", "mixtral experts resumed"
MOE_SAVED = ("--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2", "--eval_strategy", "no")


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


def test_adapter_reloaded_outside_the_mesh_gives_the_sharded_models_logits(cases) -> None:
    """The expert-parallel model's adapter (trained at ep_size 2, its gradients averaged as the Trainer does), saved
    by PEFT, onto its base in one plain process: the logits the sharded model gave on the same row."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = cases["attn_reduced:ep=2"]
    assert run["ok"] and run["adapter_same_on_ranks"], run
    base = AutoModelForCausalLM.from_pretrained(os.path.join(os.path.dirname(run["saved"]), "tiny-qwen3_moe"))
    model = PeftModel.from_pretrained(base, run["saved"]).eval()
    sharded = torch.load(os.path.join(run["saved"], "sharded_logits.pt"))
    with torch.no_grad():
        logits = model(input_ids=torch.arange(1, 17).unsqueeze(0)).logits
        with model.disable_adapter():
            plain = model(input_ids=torch.arange(1, 17).unsqueeze(0)).logits
    assert torch.allclose(logits, sharded, atol=1e-5), (logits - sharded).abs().max()
    assert not torch.allclose(plain, sharded, atol=1e-5)  # the adapter is in those logits


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


@pytest.fixture(scope="module")
def runs(tmp_path_factory, model_cache):
    models = build_all(model_cache)
    named = {}
    for family in ("qwen3_moe", "mixtral"):
        model = ("--model_name_or_path", str(models[family]))
        named[f"{family} ep2"] = (*model, *RUN, *EP2)
        named[f"{family} ep1"] = (*model, *RUN)
    for name in (STRAIGHT, STOPPED, RESUMED):
        named[name] = ("--model_name_or_path", str(models["qwen3_moe"]), *SAVED)
    for name in (MOE_STRAIGHT, MOE_RESUMED):  # the base config's all-linear: attention, experts and router
        named[name] = ("--model_name_or_path", str(models["mixtral"]), *MOE_SAVED)
    named[COPIED] = ("--model_name_or_path", str(models["qwen3_moe"]), *RUN, *EP2)  # last: it fails
    root = tmp_path_factory.mktemp("ep-runs")
    env = {"FSDP_TUNE_TEST_COPIED_EXPERTS": COPIED}
    return launch_group(root, model_cache, named, env=env, before_launch=_stop_then_resume)


def _stop_then_resume(members) -> None:
    """STOPPED finds the launcher's stop file at its first step's end (a preemption); RESUMED resumes its
    checkpoint, and MOE_RESUMED MOE_STRAIGHT's checkpoint-2, as `--resume_from_checkpoint` would (the launcher
    checks a folder that exists; these are written later in the same launch)."""
    from fsdp_tune.runfiles import STOP_FILE

    (members[STOPPED].output_dir / STOP_FILE).write_text("15")
    for resumed, checkpoint in (
        (RESUMED, members[STOPPED].output_dir / "checkpoint-1"),
        (MOE_RESUMED, members[MOE_STRAIGHT].output_dir / "checkpoint-2"),
    ):
        resolved = members[resumed].resolved
        handoff = json.loads(resolved.read_text())
        handoff["spec"]["resume_from_checkpoint"] = str(checkpoint)
        resolved.write_text(json.dumps(handoff))


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_ep2_trains_the_run_ep1_trains(runs, family) -> None:
    from safetensors.torch import load_file

    ep2, ep1 = runs[f"{family} ep2"], runs[f"{family} ep1"]
    assert ep2.spec.loading.distributed_config.kwargs() == {"fsdp_size": 2, "ep_size": 2}
    assert ep1.spec.loading.distributed_config is None
    assert "DistributedConfig(fsdp_size=2, ep_size=2)" in ep2.plan
    s2, s1 = ep2.summary, ep1.summary
    assert len(s2["losses"]) == len(s1["losses"]) == 3
    for step, (a, b) in enumerate(zip(s2["losses"], s1["losses"], strict=True), 1):
        assert math.isclose(a, b, rel_tol=REL_TOL), (family, step, a, b)
    checked = s2["extra"]["self_check"]
    assert checked["whole"] == 16 and checked["experts"] == 4, checked  # 2 layers x (4 LoRA, 2 expert tensors)
    a2 = load_file(str(ep2.output_dir / "adapter_model.safetensors"))
    a1 = load_file(str(ep1.output_dir / "adapter_model.safetensors"))
    assert a2.keys() == a1.keys() and len(a2) == 16
    for name, tensor in a2.items():
        assert torch_close(tensor, a1[name]), name


def torch_close(a, b) -> bool:
    import torch

    return torch.allclose(a, b, rtol=REL_TOL, atol=1e-7)


def test_ep2_adapter_loads_outside_any_mesh(runs, model_cache) -> None:
    """The final adapter of the expert-parallel run, onto its base in one plain process."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = runs["qwen3_moe ep2"]
    base = AutoModelForCausalLM.from_pretrained(str(build_all(model_cache)["qwen3_moe"]), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(run.output_dir))
    ids = torch.arange(1, 17).unsqueeze(0)
    with torch.no_grad():
        tuned = model(input_ids=ids).logits
        with model.disable_adapter():
            plain = model(input_ids=ids).logits
    assert not torch.equal(tuned, plain)  # the trained adapter changes the model


def test_self_check_stops_experts_copied_from_rank_0(runs) -> None:
    copied = runs[COPIED]
    assert runs.proc.returncode != 0 and not (copied.output_dir / "fsdp_tune_summary.json").exists()
    logs = copied.logs()
    failed = [ln for ln in logs.splitlines() if "distributed self-check failed after step 1" in ln]
    assert failed and "experts.gate_up_proj is split over the expert-parallel ranks" in failed[0], logs[-4000:]


def test_ep2_run_stopped_and_resumed_reproduces_the_uninterrupted_steps(runs) -> None:
    """Checkpoints of a model sharded at load (transformers' Trainer refuses them, trainer.py:633): the replicated
    adapter, the optimizer, the scheduler and each rank's RNG, marked complete; resumed after a stop at step 1, the
    run's steps 2-4 are the uninterrupted run's and so is its final adapter."""
    from safetensors.torch import load_file

    from fsdp_tune.rundir.checkpoints import verify
    from fsdp_tune.rundir.pickles import check_checkpoint

    straight, stopped, resumed = runs[STRAIGHT], runs[STOPPED], runs[RESUMED]
    for folder in (straight.output_dir / "checkpoint-2", straight.output_dir / "checkpoint-4"):
        names = {p.name for p in folder.iterdir()}
        assert {"adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"} <= names, names
        assert {"rng_state_0.pth", "rng_state_1.pth", "fsdp_tune_complete"} <= names, names
        assert verify(folder) is None and check_checkpoint(folder) is None
    stop = json.loads((stopped.output_dir / "fsdp_tune_summary.json").read_text())
    assert stop["kind"] == "interrupted" and stop["interrupted_at_step"] == 1 and stop["checkpoint_saved"], stop
    assert verify(stopped.output_dir / "checkpoint-1") is None
    want = {r["step"]: r for r in _logged(straight.output_dir)}
    got = {r["step"]: r for r in _logged(resumed.output_dir)}  # what the resumed launch itself trained
    assert sorted(want) == [1, 2, 3, 4] and sorted(got) == [2, 3, 4], (want, got)
    for step, row in got.items():  # the adapter (step 2), the optimizer (3, 4) and the schedule came back
        assert math.isclose(row["loss"], want[step]["loss"], rel_tol=REL_TOL), (step, row, want[step])
        assert math.isclose(row["learning_rate"], want[step]["learning_rate"], rel_tol=REL_TOL), (step, row)
    a = load_file(str(straight.output_dir / "adapter_model.safetensors"))
    b = load_file(str(resumed.output_dir / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and len(a) == 16
    for name, tensor in a.items():
        assert torch_close(tensor, b[name]), name
    # the last checkpoint is already a PEFT adapter folder, the final adapter (what `export` says of it, pointing at
    # chat and merge), and `latest` finds the stopped run's checkpoint
    from typer.testing import CliRunner

    from fsdp_tune.cli.app import app
    from fsdp_tune.rundir.checkpoints import latest_complete

    last = straight.output_dir / "checkpoint-4"
    kept = load_file(str(last / "adapter_model.safetensors"))
    assert (last / "adapter_config.json").exists() and all(kept[n].equal(t) for n, t in a.items())
    r = CliRunner().invoke(app, ["export", str(last), "-o", str(straight.output_dir.parent / "exported-4")])
    assert r.exit_code == 2 and "already holds a PEFT adapter" in r.output, r.output
    assert latest_complete(stopped.output_dir)[0].path == stopped.output_dir / "checkpoint-1"
    start = load_file(str(stopped.output_dir / "checkpoint-1" / "adapter_model.safetensors"))
    assert not all(torch_close(t, a[n]) for n, t in start.items())  # the resumed steps changed the adapter


def _logged(output_dir) -> list[dict]:
    from fsdp_tune.runfiles import METRICS_NAME

    rows = [json.loads(line) for line in (output_dir / METRICS_NAME).read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def test_moe_resumes_as_if_never_stopped(runs) -> None:
    """Mixtral's expert LoRA (PEFT's ParamWrapper on the fused 3-D experts) through a sharded checkpoint and a
    resume from it: the resumed launch trains steps 3-4 itself and its final adapter equals the uninterrupted
    run's, bit for bit."""
    from safetensors.torch import load_file

    straight, resumed = runs[MOE_STRAIGHT], runs[MOE_RESUMED]
    assert (straight.output_dir / "checkpoint-2" / "fsdp_tune_complete").exists()
    assert [r["step"] for r in _logged(resumed.output_dir)] == [3, 4], resumed.logs()[-4000:]
    want = load_file(straight.output_dir / "adapter_model.safetensors")
    got = load_file(resumed.output_dir / "adapter_model.safetensors")
    assert any(".mlp.experts." in k for k in want), list(want)
    assert want.keys() == got.keys()
    assert all(want[k].equal(got[k]) for k in want), [k for k in want if not want[k].equal(got[k])]
