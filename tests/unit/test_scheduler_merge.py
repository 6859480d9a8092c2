"""The scheduler's topology beside the config file and the flags (schedulers/merge.py): which wins, what is said,
what is refused; the dry run's explanation; torchrun started without the scheduler's PET_* variables."""

from __future__ import annotations

import pytest

from fsdp_tune.errors import PreflightError
from fsdp_tune.launch import torchrun
from fsdp_tune.launch.train import plan_run
from fsdp_tune.schedulers import merge, topology
from fsdp_tune.validate import check
from tests.conftest import FIXTURES, REPO
from tests.unit.test_scheduler_topology import PET_NODE1, SLURM_NODE1

BASE = str(FIXTURES / "tiny_lora.yaml")  # num_processes 2, use_cpu true
SEED = str(REPO / "configs" / "fsdp_config.yaml")  # num_processes 8, num_machines 1, machine_rank 0


def _merged(config: str, flags: list[str], env: dict):
    read = topology.read(env)
    checked = check(config, flags, scheduler=lambda a: merge.merge(read, a))
    rules = sorted({f.rule for f in checked.findings if f.rule.startswith("PF09")})
    return checked.config, rules, checked.findings


def test_the_seed_file_written_for_one_machine_runs_on_the_schedulers_two() -> None:
    cfg, rules, findings = _merged(SEED, [], SLURM_NODE1)
    lc = cfg.launch
    assert (lc.num_machines, lc.machine_rank, lc.main_process_ip, lc.num_processes) == (2, 1, "gpu-07", 16)
    assert rules == ["PF093"]  # num_machines 1 and machine_rank 0 replaced, 8 a machine kept on 2 machines
    said = " ".join(f.message for f in findings if f.rule == "PF093")
    assert "replaced by 2 from SLURM_STEP_NUM_NODES=2" in said and "replaced by 1 from SLURM_NODEID=1" in said
    assert "is 8 a machine; on the 2 machines of SLURM_STEP_NUM_NODES=2: 16" in said
    assert str(cfg.origins["launch.machine_rank"]) == "SLURM_NODEID (environment, SLURM)"


def test_the_emitted_line_agrees_with_the_scheduler_and_says_nothing() -> None:
    cfg, rules, _ = _merged(SEED, ["--num_processes", "16", "--num_machines", "2"], SLURM_NODE1)
    assert (cfg.launch.num_processes, cfg.launch.machine_rank) == (16, 1) and rules == ["PF093"]  # the file's rank


@pytest.mark.parametrize(
    "config,flags,env,rule,said",
    [
        (
            SEED,
            ["--num_processes", "16", "--num_machines", "2"],
            SLURM_NODE1 | {"SLURM_GPUS_ON_NODE": "4"},
            "PF092",
            "4",
        ),
        (SEED, ["--num_machines", "3"], SLURM_NODE1, "PF092", "contradicts SLURM_STEP_NUM_NODES=2"),
        (SEED, ["--machine_rank", "0"], PET_NODE1, "PF092", "contradicts PET_NODE_RANK=1"),
        (SEED, ["--num_processes", "8", "--num_machines", "2"], PET_NODE1, "PF092", "PET_NPROC_PER_NODE=8"),
    ],
)
def test_a_flag_against_the_scheduler_is_refused(config, flags, env, rule, said) -> None:
    with pytest.raises(PreflightError) as err:
        _merged(config, flags, env)
    assert [f.rule for f in err.value.findings] == [rule]
    assert said in err.value.findings[0].message, err.value.findings[0]


def test_an_exact_process_count_beats_the_file_a_ceiling_keeps_fewer(tmp_path) -> None:
    four = tmp_path / "four.yaml"  # the seed's file with 4 processes on its one machine
    four.write_text(open(SEED).read().replace("num_processes: 8", "num_processes: 4"))
    cfg, rules, findings = _merged(str(four), [], PET_NODE1)  # 4 a machine in the file vs PET's exact 8
    assert cfg.launch.num_processes == 16 and rules == ["PF093"]
    assert any("PET_NPROC_PER_NODE=8 (processes a node) is used instead" in f.message for f in findings)
    cfg, _, _ = _merged(SEED, ["--num_processes", "8", "--num_machines", "2"], SLURM_NODE1)  # 4 of the 8 GPUs
    assert cfg.launch.num_processes == 8
    cfg, _, _ = _merged(BASE, [], SLURM_NODE1)  # a CPU run: SLURM's GPUs say nothing of its processes
    assert cfg.launch.num_processes == 4 and cfg.launch.use_cpu


def test_an_address_given_on_the_command_line_wins_with_a_note() -> None:
    cfg, rules, findings = _merged(SEED, ["--main_process_ip", "10.9.9.9"], PET_NODE1)
    assert cfg.launch.main_process_ip == "10.9.9.9" and cfg.launch.main_process_port == 29500
    note = [f for f in findings if f.key == "--main_process_ip"]
    assert note and note[0].severity.value == "note" and "llama-node-0-0.llama" in note[0].message


def test_no_scheduler_changes_nothing() -> None:
    plain = check(SEED, ["--num_processes", "4"]).config
    cfg, rules, _ = _merged(SEED, ["--num_processes", "4"], {})
    assert cfg.launch == plain.launch and rules == []


def test_the_dry_run_says_where_the_topology_came_from(tmp_path) -> None:
    env = SLURM_NODE1 | {"SLURM_STEP_NODELIST": "127.0.0.[1-2]", "SLURM_JOB_NODELIST": "127.0.0.[1-2]"}
    env.pop("SLURMD_NODENAME")
    planned = plan_run(BASE, ["--output_dir", str(tmp_path / "o")], print, env=env)
    w = planned.spec.world
    assert (w.nnodes, w.node_rank, w.master_addr, w.world_size) == (2, 1, "127.0.0.1", 4)
    said = planned.topology.describe()
    assert "this is machine 1 (SLURM_NODEID=1)" in said
    assert "machine 0 at 127.0.0.1 (the first host of SLURM_STEP_NODELIST=127.0.0.[1-2])" in said
    assert "--node_rank=1" in " ".join(torchrun.command(planned.spec))


def test_torchrun_is_started_without_the_schedulers_pet_variables(tmp_path, monkeypatch) -> None:
    """torchrun reads PET_<ARG> as its own arguments: PET_RDZV_BACKEND would turn the spec's static rendezvous into
    c10d. The spec's arguments are all torchrun gets."""
    planned = plan_run(BASE, ["--output_dir", str(tmp_path / "o")], print, env=PET_NODE1 | {"PET_MASTER_ADDR": "x"})
    seen: dict = {}

    class Started(Exception):
        pass

    def popen(cmd, env, **kw):
        seen.update(env)
        raise Started

    monkeypatch.setattr(torchrun.subprocess, "Popen", popen)
    for name, value in PET_NODE1.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PET_RDZV_BACKEND", "c10d")
    (tmp_path / "o").mkdir()
    with pytest.raises(Started):
        torchrun.run(planned.spec)
    assert seen and not [k for k in seen if k.startswith("PET_")]
