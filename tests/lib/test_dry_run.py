"""`train --dry_run`: the plan and the planner's memory summary, nothing started (imports torch for the
planner's meta-device count, hence this layer)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from tests.conftest import FIXTURES, REPO, seed_flags

runner = CliRunner()
BASE = str(FIXTURES / "tiny_lora.yaml")


def train(*args: str):
    return runner.invoke(app, ["train", *args])


def exits_as_the_launch_would(r) -> bool:
    """A dry run exits 2 exactly when this machine's pre-flight (or the simulated node's) said the launch could not
    start (#48: it exited 0 after printing the errors), else 0; the plan is printed either way. Offline and without
    a GPU (the tests' machine), the seed launches are such runs: PF003/PF015, PF020."""
    if r.stdout.lstrip().startswith("{"):
        refused = any(f["severity"] == "error" for f in json.loads(r.stdout)["preflight"])
    else:
        refused = "could not start it as it stands" in r.output
    return r.exit_code == (2 if refused else 0)


@pytest.mark.parametrize("script,nproc", [("run_peft_fsdp.sh", 8), ("run_peft_qlora_fsdp.sh", 2)])
def test_seed_scripts_dry_run(script: str, nproc: int, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the seed's relative --output_dir must not appear in the repo
    config, flags = seed_flags(script)
    r = train("--config", str(REPO / config), *flags, "--dry_run")
    assert exits_as_the_launch_would(r), r.output
    assert f"--nproc_per_node={nproc}" in r.output and "-m fsdp_tune.worker" in r.output
    assert "dry run: nothing was started" in r.output
    lines = r.output.splitlines()
    # the plan's own lines: no fsdp_version in the seed's YAML means FSDP2 (said in one note), loaded sharded
    assert any(line.startswith("  fsdp: FSDP2, reshard_after_forward=true,") for line in lines), r.output
    assert "no fsdp_version: FSDP2; `accelerate launch` would run FSDP1; `fsdp_version: 1` keeps it" in r.output
    assert any(line.startswith("  loading: sharded: each rank reads only its own shards") for line in lines)
    assert "checkpointing: the Trainer's gradient checkpointing" in r.output
    assert "per-GPU memory:" in r.output  # the planner's summary for the 70B seed
    assert not any(tmp_path.iterdir())  # nothing written


def test_seed_script_forwards_extra_args(tmp_path) -> None:
    import subprocess

    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_peft_qlora_fsdp.sh"), "--dry_run", "--output_dir", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    refused = "could not start it as it stands" in out.stderr  # offline, no GPU: PF003, PF015, PF020
    assert out.returncode == (2 if refused else 0), out.stderr
    assert "QLoRA: 4-bit nf4, storage bfloat16, compute bfloat16, nested=true" in out.stdout


def test_dry_run_on_demo_writes_nothing(tmp_path) -> None:
    r = train("--config", str(REPO / "configs" / "demo_cpu.yaml"), "--output_dir", str(tmp_path / "o"), "--dry_run")
    assert exits_as_the_launch_would(r), r.output
    assert "2 ranks on 1 machine" in r.output and "CPU, gloo" in r.output and "--standalone" in r.output
    assert not (tmp_path / "o").exists()
    assert "memory plan (fsdp-tune plan):" in r.output and "per-rank peak host memory" in r.output
    assert "GiB available on this machine: fits" in r.output  # a CPU run's host RAM, judged against this machine


def test_dry_run_reports_previous_run(tmp_path) -> None:
    out = tmp_path / "o"
    (out / "checkpoint-5").mkdir(parents=True)
    r = train("--config", BASE, "--output_dir", str(out), "--dry_run")
    assert r.exit_code == 2 and "PF031" in r.output  # train would refuse it: the dry run exits as the launch would


def test_dry_run_json_is_the_rank_spec(tmp_path) -> None:
    """`--dry_run --json` prints the RankSpec the ranks would execute, parseable, and starts nothing."""
    import json

    from fsdp_tune.decide.spec import from_dict

    out = tmp_path / "o"
    r = train("--config", BASE, "--output_dir", str(out), "--dry_run", "--json")
    assert exits_as_the_launch_would(r), r.output
    data = json.loads(r.stdout)
    spec = from_dict(data["spec"])
    assert (spec.device, spec.backend, spec.world.world_size) == ("cpu", "gloo", 2)
    assert spec.fsdp_version == 2 and spec.trainer_args_on()["fsdp_config"] == spec.fsdp_config.kwargs()
    assert spec.lora.r == 8 and spec.output_dir == str(out)
    assert data["torchrun"][-1] == spec.resolved_path and not out.exists()


def test_accelerate_nd_example_shows_its_mesh(tmp_path) -> None:
    """accelerate's own N-D example (cp 4 x dp_shard 2 on 8 GPUs): the plan carries the mesh to the ranks; on a
    machine without GPUs it plans a CPU run (context parallelism's attention on CPU: worker/cpu_cp.py)."""
    import json

    nd = str(FIXTURES / "peer-configs" / "accelerate-nd.yaml")
    flags = ["--model_name_or_path", "builtin:tiny-llama", "--dataset_name", "builtin:demo-chat"]
    r = train("--config", nd, *flags, "--output_dir", str(tmp_path / "o"), "--dry_run")
    assert exits_as_the_launch_would(r), r.output
    assert "device mesh: cp 4 x dp_shard 2" in r.output
    data = json.loads(train("--config", nd, *flags, "--output_dir", str(tmp_path / "o"), "--dry_run", "--json").stdout)
    assert data["spec"]["parallelism"] == {
        "dp_replicate_size": 1,
        "tp_size": 1,
        "cp_size": 4,
        "dp_shard_size": 2,
        "cp_comm_strategy": "allgather",
    }
    # torch's load balancer cuts every sequence into 2 x cp chunks: every batch padded to a multiple of 8
    assert data["spec"]["trainer_args"]["pad_to_multiple_of"] == data["spec"]["data"]["pad_to_multiple_of"] == 8


def test_gpu_node_preview_from_a_cpu_machine(tmp_path, monkeypatch) -> None:
    """#25.8: `--dry_run --gpu h100 --num_processes 8` shows the launch and memory plan an 8 x H100 node would get
    (this CPU machine alone decides a CPU/gloo run of the same config); --json carries the node."""
    monkeypatch.chdir(tmp_path)
    config, flags = seed_flags("run_peft_fsdp.sh")
    args = ("--config", str(REPO / config), *flags, "--dry_run", "--num_processes", "8")
    here = train(*args)
    assert exits_as_the_launch_would(here) and "CPU, gloo" in here.output
    r = train(*args, "--gpu", "h100")
    assert exits_as_the_launch_would(r), r.output
    assert "8 ranks on 1 machine (8 per machine, this is machine 0), GPU, nccl" in r.output
    assert "--nproc_per_node=8" in r.output
    assert "machine: simulated, 8 x NVIDIA H100 80GB HBM3 (79.6 GiB each)" in r.output
    assert "8 ranks on H100 80GB SXM" in r.output and "fits, with room for the allocator's cache" in r.output
    spec = train(*args, "--gpu", "h100", "--json")
    assert exits_as_the_launch_would(spec), spec.output
    import json

    out = json.loads(spec.output[spec.output.index("{") :])
    assert out["spec"]["device"] == "cuda" and out["simulated_machine"]["gpus"] == 8
    assert not any(tmp_path.iterdir())


def test_gpu_node_preview_shows_what_the_node_would_refuse(tmp_path, monkeypatch) -> None:
    """The seed's QLoRA as FSDP1 on 2 x 4090: the memory pre-flight the node would run (PF050, with the cheapest
    flags that fit) and too few GPUs for the processes (PF025), under the simulated node's heading."""
    monkeypatch.chdir(tmp_path)
    config, flags = seed_flags("run_peft_qlora_fsdp.sh")
    args = ("--config", str(REPO / config), *flags, "--dry_run", "--fsdp_version", "1", "--gpu", "4090")
    r = train(*args)
    assert r.exit_code == 2, r.output  # the simulated node could not start it: exit 2, as the launch would
    assert "2 ranks on RTX 4090 24GB" in r.output and "does NOT fit" in r.output
    assert "the simulated node (with this machine's files and libraries) could not start it" in r.output
    assert "PF050" in r.output and "--fsdp_version 2 (plans" in r.output
    few = train(*args, "--gpus", "1")
    assert "PF025" in few.output and "2 processes per machine, but the ranks would see 1 GPU(s)" in few.output


def test_a_dry_run_that_could_not_start_exits_2(tmp_path) -> None:
    """#48: a CI gate on `--dry_run` must fail what cannot start (it printed the PF error and exited 0)."""
    argv = ["--model_name_or_path", "builtin:tiny-llama", "--dataset_name", str(tmp_path / "nope.jsonl")]
    argv += ["--output_dir", str(tmp_path / "o"), "--use_cpu", "true", "--dry_run"]
    r = train(*argv)
    assert r.exit_code == 2, r.output
    assert "this machine could not start it as it stands" in r.output and "PF010" in r.output
    assert "dry run: nothing was started" in r.output and not (tmp_path / "o").exists()
    as_json = train(*argv, "--json")
    assert as_json.exit_code == 2
    assert [f["rule"] for f in json.loads(as_json.stdout)["preflight"] if f["severity"] == "error"] == ["PF010"]
