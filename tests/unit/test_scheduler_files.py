"""The job files `--emit` writes, for a job shaped like the seed's 70B LoRA launch on 2 x 8 H100 (the real one,
planned, is tests/lib/test_emit_seed.py): each checked against its scheduler's published schema, what each says,
and what `--emit` refuses before planning (PF095)."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex

import pytest
import yaml

from fsdp_tune.errors import PreflightError, UsageError
from fsdp_tune.launch.emit import emit
from fsdp_tune.schedulers import emitters
from fsdp_tune.schedulers import job as jobs
from fsdp_tune.schedulers.emitters import EMITTERS
from tests.conftest import FIXTURES, REPO, seed_flags
from tests.scheduler_schemas import PROBLEMS

CONFIG, FLAGS = seed_flags("run_peft_fsdp.sh")
PLAN = {"step_time": {"step_s": 62.9}, "host_memory_gib_per_node": 39.84, "range_gib": [42.8, 68.5]}
PLAN |= {"gpu_memory_gib": 79.6, "trainable_params": 103_546_880, "device": "H100 80GB SXM"}


def _job(kind: str) -> jobs.Job:
    mount = EMITTERS[kind].mount
    out = f"{mount}/llama-sft-lora-fsdp" if mount else "/scratch/team/llama-sft-lora-fsdp"
    args = [*jobs.without(FLAGS, ("output_dir",)), "--num_processes", "16", "--num_machines", "2"]
    args += ["--output_dir", out, "--resume_from_checkpoint", "latest"]
    grace = jobs.grace_s(PLAN, PLAN["trainable_params"])
    return jobs.Job(
        scheduler=kind,
        name="llama-sft-lora-fsdp",
        nodes=2,
        procs_per_node=8,
        gpu="h100",
        gpu_name="H100 80GB SXM",
        memory_gib=jobs.memory_gib(PLAN),
        cpus=8,
        grace_s=grace,
        config=CONFIG,
        args=tuple(args),
        output_dir=out,
        shared=mount and "llama-shared" or "/scratch/team",
        mount=mount or "/scratch/team",
        env={"HF_HOME": f"{mount or '/scratch/team'}/hf-cache"},
        image="ghcr.io/example/fsdp-tune:0.1.0",
        workdir="/scratch/team/fsdp-tune",
        facts=jobs.facts(PLAN, 2, 8, "H100 80GB SXM", grace),
    )


@pytest.mark.parametrize("kind", list(EMITTERS))
def test_each_file_passes_its_schedulers_schema(kind: str) -> None:
    assert PROBLEMS[kind](EMITTERS[kind].render(_job(kind))) == []


def test_the_grace_covers_a_step_and_a_checkpoint() -> None:
    assert jobs.grace_s(PLAN, PLAN["trainable_params"]) == 120  # 63 s + 1.2 s + 30 s < the README's 120 s
    assert jobs.grace_s({"step_time": {"step_s": 200.0}}, 10**9) == 250  # 200 + 12 + 30, up to 10 s
    assert jobs.memory_gib(PLAN) == 48 and jobs.memory_gib({"host_memory_gib_per_node": 0.5}) == 8


def test_slurm_script() -> None:
    text = EMITTERS["slurm"].render(_job("slurm"))
    directives = dict(re.findall(r"^#SBATCH --([a-z-]+)=?(.*)$", text, re.M))
    assert directives["nodes"] == "2" and directives["gpus-per-node"] == "8" and directives["ntasks-per-node"] == "1"
    assert directives["signal"] == "USR1@120" and "requeue" in directives and directives["mem"] == "48G"
    assert directives["chdir"] == "/scratch/team/fsdp-tune"
    (srun,) = [line for line in text.splitlines() if line.startswith("srun ")]
    words = shlex.split(srun)
    assert words[words.index("$FSDP_TUNE") + 1 :] == _job("slurm").argv
    assert 'if [ "$status" -eq 143 ]; then scontrol requeue "$SLURM_JOB_ID"; fi' in text
    assert '[ -n "${HF_HOME:-}" ] || HF_HOME=/scratch/team/hf-cache; export HF_HOME' in text


def test_skypilot_task() -> None:
    job = _job("skypilot")
    task = yaml.safe_load(EMITTERS["skypilot"].render(job))
    assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == "H100:8"
    assert task["resources"]["memory"] == "48+" and task["resources"]["job_recovery"]["recover_on_exit_codes"] == [143]
    assert task["file_mounts"] == {"/shared": {"name": "llama-shared", "mode": "MOUNT_CACHED"}}
    (hook,) = task["config"]["hooks"]
    assert hook["events"] == ["preemption"] and hook["timeout"] == 120
    assert "/shared/llama-sft-lora-fsdp/fsdp_tune_stop" in hook["run"]
    assert shlex.split(task["run"]) == ["fsdp-tune", *job.argv] and task["secrets"] == {"HF_TOKEN": None}


def test_kubeflow_train_job() -> None:
    job = _job("kubeflow")
    doc = yaml.safe_load(EMITTERS["kubeflow"].render(job))
    trainer = doc["spec"]["trainer"]
    assert trainer["command"] == ["fsdp-tune"] and trainer["args"] == job.argv
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": 8}
    pod = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = pod["template"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "llama-shared"
    # what the torch runtime sets must not be set by the TrainJob (its webhook refuses reserved names)
    assert not {e["name"] for e in trainer["env"]} & {"PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR"}


@pytest.mark.parametrize(
    "kind,edit,problem",
    [
        ("slurm", ("--requeue", "--requeu"), "--requeu: not an option sbatch(1)"),
        ("slurm", ("--kill-on-bad-exit=1", "--kill-on-bad=1"), "--kill-on-bad=1: not an option srun(1)"),
        ("slurm", ('exit "$status"', "fi fi"), "bash -n"),
        ("skypilot", ("accelerators:", "acelerators:"), "'acelerators' was unexpected"),
        ("skypilot", ("MOUNT_CACHED", "MOUNTED"), "'MOUNTED' is not one of"),
        ("skypilot", ("- preemption", "- preempted"), "'preempted' is not one of"),
        (
            "kubeflow",
            ("numProcPerNode: 8", "numProcPerNode: 8\n    workers: 3"),
            "/spec/trainer/workers: unknown field",
        ),
        ("kubeflow", ("numNodes: 2", "numNodes: two"), "'two' is not of type 'integer'"),
        ("kubeflow", ("claimName:", "claim:"), "'claimName' is a required property"),
    ],
)
def test_the_checks_refuse_a_broken_file(kind: str, edit: tuple[str, str], problem: str) -> None:
    text = EMITTERS[kind].render(_job(kind))
    assert edit[0] in text
    problems = PROBLEMS[kind](text.replace(edit[0], edit[1], 1))
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    "kind,flags,key",
    [
        ("slurm", ["--machine_rank", "1"], "--machine_rank"),
        ("skypilot", ["--main_process_ip", "10.0.0.1"], "--main_process_ip"),
        ("slurm", ["--gpu_ids", "0,1"], "--gpu_ids"),
        ("skypilot", ["--hub_token", "hf_secret"], "--hub_token"),
        ("slurm", ["--resume_from_checkpoint", "/x/checkpoint-4"], "--resume_from_checkpoint"),
        ("kubeflow", [], "--image"),
        ("kubeflow", ["--main_process_port", "29600"], "--main_process_port"),
        ("skypilot", ["--output_dir", "/data/out"], "--output_dir"),
    ],
)
def test_emit_refuses_what_the_scheduler_says_itself_or_cannot_say(kind, flags, key, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text((FIXTURES / "tiny_lora.yaml").read_text())
    image = None if key == "--image" else "x"
    with pytest.raises(PreflightError) as err:
        emit(kind, "c.yaml", ["--num_processes", "2", "--num_machines", "2", *flags], print, image=image)
    assert [(f.rule, f.key) for f in err.value.findings] == [("PF095", key)]
    assert "hf_secret" not in str(err.value.findings)


def test_emit_refuses_a_config_the_nodes_do_not_get(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PreflightError) as err:
        emit("skypilot", str(REPO / CONFIG), FLAGS, print)
    assert [f.rule for f in err.value.findings] == ["PF095"] and "outside the folder" in err.value.findings[0].message
    with pytest.raises(UsageError):
        emit("pbs", str(REPO / CONFIG), FLAGS, print)


def test_the_shipped_sbatch_script_passes_the_same_checks() -> None:
    text = (REPO / "scripts" / "slurm_fsdp.sbatch").read_text()
    assert PROBLEMS["slurm"](text) == []
    assert "--machine_rank" not in text and "--resume_from_checkpoint latest" in text  # SLURM's variables say it


def test_slurm_names_what_only_the_cluster_knows() -> None:
    """#48: --time, --partition and --account as FILL_ME values sbatch refuses until filled, and the line where the
    nodes' environment is activated; the header says both."""
    text = EMITTERS["slurm"].render(_job("slurm"))
    directives = dict(re.findall(r"^#SBATCH --([a-z-]+)=?(.*)$", text, re.M))
    assert directives["time"] == "FILL_ME_HH:MM:SS" and directives["partition"] == "FILL_ME_PARTITION"
    assert directives["account"] == "FILL_ME_ACCOUNT"
    assert "# before that: fill the FILL_ME values" in text
    assert "# FILL_ME (if the nodes need it): make fsdp-tune runnable here: `module load ...`" in text
    assert "not known to be shared" not in text and "# shared folder (output, checkpoints" in text
    unknown = EMITTERS["slurm"].render(dataclasses.replace(_job("slurm"), shared_given=False))
    assert "# shared folder" not in unknown and "not known to be shared (no --shared)" in unknown


@pytest.mark.parametrize(
    "shared,workdir,config",
    [(None, "CWD", "c.yaml"), ("CWD/..", "CWD", "c.yaml"), ("/elsewhere", "/elsewhere", "CWD/c.yaml")],
)
def test_slurm_runs_where_relative_paths_resolve_on_the_shared_folder(shared, workdir, config, tmp_path, monkeypatch):
    """--chdir: the folder emitted from when it is under --shared (or no --shared is given); else --shared, the
    config then named by its absolute path."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    fill = lambda s: s and s.replace("CWD", str(cwd))  # noqa: E731
    got = emitters.slurm_folders(fill(shared), "c.yaml")
    assert (os.path.normpath(got[0]), got[1]) == (os.path.normpath(fill(workdir)), fill(config))


def test_local_files_the_nodes_would_not_find_are_named(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    slurm = dataclasses.replace(_job("slurm"), workdir="/scratch/team", data_paths=("data/x.jsonl", "/home/me/y.csv"))
    said = emitters.local_files(EMITTERS["slurm"], "slurm", slurm, "c.yaml")
    assert said[0].startswith(f"warning: --config c.yaml: the nodes read {tmp_path}/c.yaml, which is not under")
    assert said[1].startswith("warning: data data/x.jsonl: relative, and the job runs in /scratch/team (--chdir")
    assert "/home/me/y.csv, which is not under --shared /scratch/team" in said[2] and len(said) == 3
    alone = dataclasses.replace(slurm, shared_given=False, data_paths=())
    assert emitters.local_files(EMITTERS["slurm"], "slurm", alone, "c.yaml")[0].startswith("warning: no --shared:")
    sky = dataclasses.replace(_job("skypilot"), data_paths=("data/x.jsonl", "/shared/d.jsonl", "/home/me/y.csv"))
    (only,) = emitters.local_files(EMITTERS["skypilot"], "skypilot", sky, "c.yaml")  # workdir is synced
    assert only.startswith("warning: data /home/me/y.csv: neither in the synced workdir")
    kube = dataclasses.replace(_job("kubeflow"), config="c.yaml", data_paths=("data/x.jsonl", "/shared/d.jsonl"))
    said = emitters.local_files(EMITTERS["kubeflow"], "kubeflow", kube, "c.yaml")
    assert [s.split(":")[0] for s in said] == ["warning", "warning"] and "--image ghcr.io" in said[1]
    text = EMITTERS["kubeflow"].render(kube)
    assert "# files the image must hold (a relative path: in its working folder): c.yaml, data/x.jsonl\n" in text


def test_skypilot_setup_pins_the_versions_validated_here() -> None:
    from importlib import metadata

    from fsdp_tune.launch.emit import _pins

    pins = _pins()
    assert pins == {"fsdp-tune": metadata.version("fsdp-tune"), "torch": metadata.version("torch").split("+")[0]}
    job = dataclasses.replace(_job("skypilot"), pins=pins)
    setup = yaml.safe_load(EMITTERS["skypilot"].render(job))["setup"]
    assert shlex.split(setup, comments=True) == [
        "python",
        "-m",
        "pip",
        "install",
        f"fsdp-tune=={pins['fsdp-tune']}",
        f"torch=={pins['torch']}",
    ]


def test_emit_runs_the_rules_once(tmp_path, monkeypatch) -> None:
    """`--emit` reads the job's size from the typed config, then validates the job's own command line once (in
    plan_run): the rules are not run a first time only for their findings to be dropped (#47)."""
    import fsdp_tune.launch.emit as emit_step
    import fsdp_tune.validate as validate

    calls = []
    real = validate.run_rules
    monkeypatch.setattr(validate, "run_rules", lambda cfg: calls.append(cfg) or real(cfg))

    class Planned(Exception):
        pass

    def stop(*args, **kwargs):
        raise Planned

    monkeypatch.setattr(emit_step, "_plan", stop)  # the memory plan (torch) is not this test's
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text((FIXTURES / "tiny_lora.yaml").read_text())
    with pytest.raises(Planned):
        emit("slurm", "c.yaml", ["--num_processes", "2", "--num_machines", "2"], print)
    assert len(calls) == 1
