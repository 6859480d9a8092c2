"""Each scheduler's emitted job, run for real: its own command on two "nodes" of this machine over loopback, with
the variables that scheduler sets on each node, forms one 2-node job and trains to a saved adapter.

What stands in for the scheduler (and nothing else): SLURM's batch host runs the emitted sbatch script itself, its
srun is tests/dist/fake_srun.py (one task a node with srun's step variables); SkyPilot's node runs the task's `run`
with its envs and the SKYPILOT_* variables; Kubeflow's trainer container runs the TrainJob's command and args with
its env and the torch runtime's PET_* variables (PET_MASTER_ADDR is 127.0.0.1: the runtime's DNS name for node 0
resolves only in the cluster). The shared mount (/shared) is a folder here, the same path substituted in the file.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fsdp_tune.launch.emit import emit
from fsdp_tune.schedulers.emitters import EMITTERS
from tests.conftest import FIXTURES
from tests.dist.conftest import TIMEOUT, offline_env
from tests.scheduler_schemas import PROBLEMS

HOSTS = ("127.0.0.1", "127.0.0.2")  # both loopback on Linux: node 0 listens on the first
STEPS = "2"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _emitted(kind: str, work: Path, shared: Path, port: int, monkeypatch) -> str:
    monkeypatch.chdir(work)
    args = ["--output_dir", "run", "--max_steps", STEPS, "--num_processes", "2", "--num_machines", "2"]
    if kind != "kubeflow":  # Kubeflow's runtime gives the port (PET_MASTER_PORT); the others take the launch's
        args += ["--main_process_port", str(port)]
    where = str(shared) if kind == "slurm" else "test-shared"
    job = emit(kind, "tiny_lora.yaml", args, print, shared=where, image="local/fsdp-tune:test")
    text = EMITTERS[kind].render(job)
    assert PROBLEMS[kind](text) == [], text
    return text


def _node_env(model_cache: Path, bin_dir: Path) -> dict[str, str]:
    env = offline_env(model_cache)
    env["PATH"] = f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def _wait(procs: list[subprocess.Popen], logs: list[Path]) -> list[int]:
    try:
        return [p.wait(timeout=TIMEOUT) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("the job did not finish in time:\n" + _logs(logs))
    finally:
        for p in procs:
            p.kill()


def _logs(logs: list[Path]) -> str:
    return "\n=====\n".join(f"--- {p.name}\n{p.read_text()[-6000:]}" for p in logs if p.exists())


def _run_slurm(text: str, work: Path, tmp: Path, env: dict) -> list[Path]:
    script = tmp / "job.sbatch"
    script.write_text(text)
    chdir = re.search(r"^#SBATCH --chdir=(.+)$", text, re.M).group(1)
    srun = tmp / "bin" / "srun"
    srun.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).parent / "fake_srun.py"}" "$@"\n')
    srun.chmod(0o755)
    job_env = dict(env, SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="2", SLURM_NNODES="2", FAKE_SRUN_LOGS=str(tmp))
    job_env.update(SLURM_JOB_NODELIST="127.0.0.[1-2]", SLURM_NODELIST="127.0.0.[1-2]", FAKE_SRUN_HOSTS=" ".join(HOSTS))
    batch = tmp / "batch.log"
    with open(batch, "w") as out:
        proc = subprocess.Popen(["bash", str(script)], cwd=chdir, env=job_env, stdout=out, stderr=subprocess.STDOUT)
    logs = [tmp / "node-0.log", tmp / "node-1.log", batch]
    assert _wait([proc], logs) == [0], _logs(logs)
    return logs


def _run_skypilot(text: str, work: Path, tmp: Path, env: dict, shared: Path) -> list[Path]:
    task = yaml.safe_load(text)
    (mount,) = task["file_mounts"]
    run = task["run"].replace(mount, str(shared))
    envs = {k: v.replace(mount, str(shared)) for k, v in task["envs"].items()}
    node = dict(env, **envs, SKYPILOT_NUM_NODES=str(task["num_nodes"]), SKYPILOT_NODE_IPS="\n".join(HOSTS))
    node["SKYPILOT_NUM_GPUS_PER_NODE"] = "0"  # a CPU task: no accelerators asked
    return _nodes(["bash", "-c", run], work, tmp, node, lambda k: {"SKYPILOT_NODE_RANK": str(k)})


def _run_kubeflow(text: str, work: Path, tmp: Path, env: dict, shared: Path, port: int) -> list[Path]:
    trainer = yaml.safe_load(text)["spec"]["trainer"]
    mount = yaml.safe_load(text)["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    mount = mount["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    sub = lambda s: s.replace(mount["mountPath"], str(shared))  # noqa: E731
    argv = [*trainer["command"], *(sub(a) for a in trainer["args"])]
    node = dict(env, **{e["name"]: sub(e["value"]) for e in trainer["env"] if "value" in e})
    node.update(PET_NNODES=str(trainer["numNodes"]), PET_NPROC_PER_NODE=str(trainer["numProcPerNode"]))
    node.update(PET_MASTER_ADDR=HOSTS[0], PET_MASTER_PORT=str(port))
    return _nodes(argv, work, tmp, node, lambda k: {"PET_NODE_RANK": str(k)})


def _nodes(argv: list[str], work: Path, tmp: Path, env: dict, own) -> list[Path]:
    logs = [tmp / f"node-{k}.log" for k in range(2)]
    procs = []
    for k, log in enumerate(logs):
        with open(log, "w") as out:
            procs.append(
                subprocess.Popen(argv, cwd=work, env=dict(env, **own(k)), stdout=out, stderr=subprocess.STDOUT)
            )
    assert _wait(procs, logs) == [0, 0], _logs(logs)
    return logs


@pytest.mark.parametrize("kind", ["slurm", "skypilot", "kubeflow"])
def test_emitted_job_trains_on_two_nodes(kind: str, tmp_path, model_cache, monkeypatch) -> None:
    work, shared, bin_dir = tmp_path / "work", tmp_path / "shared", tmp_path / "bin"
    for d in (work, shared, bin_dir):
        d.mkdir()
    shutil.copy(FIXTURES / "tiny_lora.yaml", work / "tiny_lora.yaml")
    port = _free_port()
    monkeypatch.setenv("FSDP_TUNE_CACHE", str(model_cache))
    text = _emitted(kind, work, shared, port, monkeypatch)
    env = _node_env(model_cache, bin_dir)
    if kind == "slurm":
        logs = _run_slurm(text, work, tmp_path, env)
    elif kind == "skypilot":
        logs = _run_skypilot(text, work, tmp_path, env, shared)
    else:
        logs = _run_kubeflow(text, work, tmp_path, env, shared, port)
    node0, node1 = (p.read_text() for p in logs[:2])
    said = _logs(logs)
    assert "2 ranks on 2 machines (1 per machine, this is machine 0)" in node0, said
    assert "this is machine 1" in node1 and "waiting for all 2 machines to join at 127.0.0.1" in node1, said
    assert f"scheduler: {EMITTERS[kind].title.split()[0]}" in node0 and "this is machine 1 (" in node1, said
    out = shared / "run"
    assert '"steps": 2' in (out / "fsdp_tune_summary.json").read_text(), said
    assert (out / "adapter_model.safetensors").stat().st_size > 0 and (out / "adapter_config.json").exists()
    assert (out / "logs" / "rank-0.log").exists() and (out / "logs" / "rank-1.log").exists()
