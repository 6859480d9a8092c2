"""A node's topology from its scheduler's variables (fsdp_tune/schedulers/): tables of environments, what each
reads, and the partial, contradictory or misplaced ones refused (PF090-PF094) before any rank starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.errors import PreflightError
from fsdp_tune.schedulers import hostlist, topology
from fsdp_tune.schedulers.variables import SCHEDULERS, SLURM
from tests.conftest import FIXTURES

BASE = str(FIXTURES / "tiny_lora.yaml")
SLURM_NODE1 = {
    "SLURM_JOB_ID": "7",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "gpu-[07-08]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "gpu-[07-08]",
    "SLURM_NODEID": "1",
    "SLURMD_NODENAME": "gpu-08",
    "SLURM_GPUS_ON_NODE": "8",
}
PET_NODE1 = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "8",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "llama-node-0-0.llama",
    "PET_MASTER_PORT": "29500",
}
SKY_NODE1 = {
    "SKYPILOT_NODE_RANK": "1",
    "SKYPILOT_NUM_NODES": "2",
    "SKYPILOT_NODE_IPS": "10.0.0.4\n10.0.0.5\n",
    "SKYPILOT_NUM_GPUS_PER_NODE": "8",
}


@pytest.mark.parametrize(
    "text,hosts",
    [
        ("node01", ["node01"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("n[8-10],login", ["n8", "n9", "n10", "login"]),
        ("gpu-a[1-2]-b[3,4]", ["gpu-a1-b3", "gpu-a1-b4", "gpu-a2-b3", "gpu-a2-b4"]),
        ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
        ("rack[001-002]", ["rack001", "rack002"]),
    ],
)
def test_hostlist_expands_as_slurm_lists(text: str, hosts: list[str]) -> None:
    assert hostlist.expand(text) == hosts


@pytest.mark.parametrize(
    "text", ["node[01-03", "node]1", "node[[1]]", "node[3-1]", "a,,b", "node[x]", "", "n[1-9999999]"]
)
def test_hostlist_refuses_what_slurm_would_not(text: str) -> None:
    with pytest.raises(hostlist.HostlistError):
        hostlist.expand(text)


@pytest.mark.parametrize(
    "env,want",
    [
        (SLURM_NODE1, {"num_machines": 2, "machine_rank": 1, "main_process_ip": "gpu-07", "nproc_per_node": 8}),
        (
            PET_NODE1,
            {"num_machines": 2, "machine_rank": 1, "main_process_ip": "llama-node-0-0.llama", "nproc_per_node": 8}
            | {"main_process_port": 29500},
        ),
        (SKY_NODE1, {"num_machines": 2, "machine_rank": 1, "main_process_ip": "10.0.0.4", "nproc_per_node": 8}),
        # a one-node SLURM job: the batch script may run it (no srun step), and a CPU job names no GPUs
        (
            {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0"},
            {"num_machines": 1, "machine_rank": 0},
        ),
        # torchrun's own spelling: PET_RDZV_ENDPOINT gives the address and port; `auto` leaves the count to us
        (
            {
                "PET_NNODES": "2:2",
                "PET_NODE_RANK": "0",
                "PET_RDZV_ENDPOINT": "10.1.1.1:29400",
                "PET_NPROC_PER_NODE": "auto",
            }
            | {"PET_RDZV_BACKEND": "c10d"},
            {"num_machines": 2, "machine_rank": 0, "main_process_ip": "10.1.1.1", "main_process_port": 29400}
            | {"rdzv_backend": "c10d"},
        ),
        # SkyPilot on a SLURM cluster: SkyPilot's variables are read, SLURM's agree on the machines
        (SKY_NODE1 | SLURM_NODE1, {"num_machines": 2, "machine_rank": 1, "main_process_ip": "10.0.0.4"}),
        ({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NODE_IPS": "10.0.0.4"}, {"machine_rank": 0}),
    ],
)
def test_each_scheduler_fills_the_launch_keys(env: dict, want: dict) -> None:
    read = topology.read(env)
    assert {k: read.get(k) for k in want} == want
    assert read.describe().startswith("scheduler: ")


def test_no_scheduler_variables_read_nothing() -> None:
    assert not topology.read({"HOME": "/root", "SKYPILOT_TASK_ID": "x", "PET_UNRELATED": "1"})


def _refused(env: dict) -> list:
    with pytest.raises(PreflightError) as err:
        topology.read(env)
    return err.value.findings


@pytest.mark.parametrize(
    "env,rule,said",
    [
        # partial
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "a[1-2]"}, "PF090", "SLURM_NODEID"),
        ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "8"}, "PF090", "PET_MASTER_ADDR or PET_RDZV_ENDPOINT"),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1"}, "PF090", "machine 0's address"),
        ({"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2"}, "PF090", "SKYPILOT_NODE_IPS"),
        ({"PET_NPROC_PER_NODE": "8"}, "PF090", "PET_NNODES"),
        # contradictory
        (SLURM_NODE1 | {"SLURM_STEP_NUM_NODES": "3"}, "PF091", "names 2 host(s), not 3"),
        (SLURM_NODE1 | {"SLURM_JOB_NUM_NODES": "3"}, "PF091", None),  # the step's count is read; job's may differ
        ({**SLURM_NODE1, "SLURM_STEP_NUM_NODES": "2", "SLURMD_NODENAME": "gpu-07"}, "PF091", "gpu-07 is host 0"),
        (PET_NODE1 | {"PET_NODE_RANK": "2"}, "PF091", "outside [0, 2)"),
        (PET_NODE1 | {"PET_RDZV_ENDPOINT": "other:29500"}, "PF091", "disagree"),
        (PET_NODE1 | {"PET_NNODES": "1:4"}, "PF091", "elastic range"),
        (PET_NODE1 | {"PET_MASTER_PORT": "0"}, "PF091", "not a TCP port"),
        (SKY_NODE1 | {"SKYPILOT_NODE_IPS": "10.0.0.4"}, "PF091", "names 1 host(s), not 2"),
        (SKY_NODE1 | {"SKYPILOT_NODE_RANK": "x"}, "PF091", "cannot be read"),
        (
            SKY_NODE1 | PET_NODE1 | {"PET_NNODES": "4", "PET_NODE_RANK": "1"},
            "PF091",
            "PET_NNODES=4 and SKYPILOT_NUM_NODES=2",
        ),
        (
            {**{k: v for k, v in SLURM_NODE1.items() if "STEP" not in k}, "SLURM_JOB_NODELIST": "x[1-2]"},
            "PF094",
            "batch script",
        ),
        (SLURM_NODE1 | {"SLURM_STEP_NUM_TASKS": "16"}, "PF094", "16 tasks on 2 node(s)"),
        ({"LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "abc", "GROUP_RANK": "0"}, "PF094", "inside a process torchrun"),
    ],
)
def test_partial_contradictory_or_misplaced_variables_are_refused(env: dict, rule: str, said: str | None) -> None:
    if said is None:  # not a contradiction: read, as srun's step says
        assert topology.read(env).get("num_machines") == 2
        return
    findings = _refused(env)
    hit = [f for f in findings if f.rule == rule]
    assert hit and said in hit[0].message + hit[0].key, findings
    assert all(f.hint and f.severity.value == "error" for f in findings)


def test_every_slurm_variable_read_is_one_slurm_documents() -> None:
    documented = set((FIXTURES / "schedulers/slurm/output_environment.txt").read_text().split())
    read = {n for r in SLURM.reads for group in r.names for n in group}
    read |= {SLURM.listed.me, SLURM.step, *SLURM.markers, "SLURM_STEP_NUM_TASKS"}
    assert read - documented == set()
    assert {s.name for s in SCHEDULERS} == {"SLURM", "Kubeflow", "SkyPilot"}


def test_train_refuses_partial_variables_before_any_rank(tmp_path, monkeypatch, fake_ranks) -> None:
    for name, value in {"PET_NNODES": "2", "PET_NODE_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    r = CliRunner().invoke(app, ["train", "--config", BASE, "--output_dir", str(tmp_path / "o")])
    assert r.exit_code == 2 and "PF090" in r.output and "no process was started" in r.output, r.output
    assert fake_ranks.specs == [] and not (tmp_path / "o").exists()


def test_train_refuses_a_flag_against_the_scheduler_before_any_rank(tmp_path, monkeypatch, fake_ranks) -> None:
    for name, value in SKY_NODE1.items():
        monkeypatch.setenv(name, value)
    flags = ["--num_machines", "3", "--num_processes", "3", "--use_cpu", "true"]
    r = CliRunner().invoke(app, ["train", "--config", BASE, "--output_dir", str(tmp_path / "o"), *flags])
    assert r.exit_code == 2 and "PF092" in r.output and "SKYPILOT_NUM_NODES=2" in r.output, r.output
    assert fake_ranks.specs == []
