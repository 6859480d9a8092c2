"""The schedulers `train --emit` writes for, one row each: the variables the scheduler gives node 0 (the launch is
planned with them, launch/emit.py), where the nodes see the shared folder, what the scheduler says itself; and
what `--emit` refuses before planning (PF095): settings the scheduler says itself or cannot say.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fsdp_tune.config.run_folder import resume_request
from fsdp_tune.errors import Finding, PreflightError, Severity
from fsdp_tune.schedulers import job as jobs
from fsdp_tune.schedulers import kubeflow, skypilot, slurm

KUBEFLOW_PORT = 29500  # the torch runtime's PET_MASTER_PORT (constants.ContainerTrainerPort)


@dataclass(frozen=True)
class Emitter:
    title: str
    render: Callable[[jobs.Job], str]
    node0: Callable[[str, int, int, bool], dict[str, str]]  # (name, nodes, per, gpus) -> node 0's variables
    mount: str | None  # where the nodes see the shared folder; None: at its own path (SLURM)
    shared: str  # what --shared names
    says: tuple[str, ...] = ()  # flags the scheduler's variables say on every node: given, they are refused


def _slurm_env(name: str, n: int, per: int, gpus: bool) -> dict[str, str]:
    hosts = "node0" if n == 1 else f"node[0-{n - 1}]"
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": str(n), "SLURM_STEP_NUM_NODES": str(n)}
    env.update(SLURM_STEP_NUM_TASKS=str(n), SLURM_NODEID="0", SLURM_STEP_NODELIST=hosts, SLURM_JOB_NODELIST=hosts)
    return dict(env, SLURM_GPUS_ON_NODE=str(per)) if gpus else env


def _kubeflow_env(name: str, n: int, per: int, gpus: bool) -> dict[str, str]:
    return {
        "PET_NNODES": str(n),
        "PET_NPROC_PER_NODE": str(per),
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",  # as the torch runtime names machine 0
        "PET_MASTER_PORT": str(KUBEFLOW_PORT),
    }


def _skypilot_env(name: str, n: int, per: int, gpus: bool) -> dict[str, str]:
    ips = "\n".join(f"10.0.0.{i + 1}" for i in range(n))
    return {
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NUM_NODES": str(n),
        "SKYPILOT_NODE_IPS": ips,
        "SKYPILOT_NUM_GPUS_PER_NODE": str(per if gpus else 0),
    }


TOPOLOGY_FLAGS = ("machine_rank", "main_process_ip")
EMITTERS = {
    "slurm": Emitter("SLURM", slurm.render, _slurm_env, None, "a folder every node sees (default: this one)"),
    "skypilot": Emitter(
        "SkyPilot", skypilot.render, _skypilot_env, "/shared", "a bucket, mounted at /shared (default: NAME-shared)"
    ),
    "kubeflow": Emitter(
        "Kubeflow Trainer",
        kubeflow.render,
        _kubeflow_env,
        "/shared",
        "a ReadWriteMany PersistentVolumeClaim, mounted at /shared (default: NAME-shared)",
        says=("main_process_port",),
    ),
}


def refusals(row: Emitter, kind: str, cfg, args: list[str], image: str | None) -> list[Finding]:
    found = []
    for flag in (*TOPOLOGY_FLAGS, *row.says):
        if jobs.given(args, flag) is not None:  # in a file the nodes share: replaced, with a warning (merge.py)
            found.append(pf085(f"--{flag}", f"{row.title} gives every node its {flag} itself", f"drop --{flag}"))
    if cfg.launch.gpu_ids not in (None, "", "all"):
        found.append(pf085("--gpu_ids", f"{row.title} chooses the GPUs it gives a node", "drop --gpu_ids"))
    if cfg.training.is_set("hub_token"):
        found.append(
            pf085("--hub_token", "a token in a job file is readable by whoever reads the file", token_hint(kind))
        )
    resume = resume_request(cfg)
    if resume and resume.lower() != "latest":
        found.append(
            pf085(
                "--resume_from_checkpoint",
                f"{resume}: a requeued job must continue from its newest checkpoint",
                "drop it: the job passes --resume_from_checkpoint latest (the first attempt starts from step 0)",
            )
        )
    if kind == "kubeflow" and not image:
        found.append(pf085("--image", "a TrainJob runs a container image", "--image IMAGE with fsdp-tune installed"))
    return found


def shared_output_dir(row: Emitter, kind: str, output_dir: str, shared: str) -> str:
    """The output folder as the nodes see it: on the shared folder."""
    if row.mount is None:
        return output_dir if Path(output_dir).is_absolute() else str(Path(shared) / output_dir)
    path = PurePosixPath(output_dir)
    if path.is_absolute() and not path.is_relative_to(row.mount):
        raise PreflightError(
            [
                pf085(
                    "--output_dir",
                    f"{output_dir} is on each node's own disk: the nodes would not share checkpoints",
                    f"a folder under {row.mount} (the shared {kind} volume), or a relative one",
                )
            ]
        )
    return str(path if path.is_absolute() else PurePosixPath(row.mount) / path)


def node_config(row: Emitter, kind: str, config: str | None) -> str | None:
    """The config file as the nodes see it: SLURM's run where this folder is; SkyPilot's workdir is this folder
    synced, Kubeflow's the image's working folder (holding this folder's files): a path relative to it."""
    if config is None or row.mount is None or not Path(config).is_absolute():
        return config
    try:
        return Path(config).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        hint = "emit from the folder that holds it (its path relative to that is what the nodes read)"
        outside = pf085("--config", f"{config} is outside the folder the {kind} nodes get", hint)
        raise PreflightError([outside]) from None


def slurm_folders(shared: str | None, config: str | None) -> tuple[str, str | None]:
    """(--chdir, the config as the job names it). The folder emitted from when no --shared is given or it is
    under --shared (relative paths resolve on the nodes as they did here); else the shared folder, with the
    config named by its absolute path (data paths: `local_files` warns)."""
    cwd = os.getcwd()
    if shared is None or _under(cwd, shared):
        return cwd, config
    return shared, (os.path.abspath(config) if config and not os.path.isabs(config) else config)


def local_files(row: Emitter, kind: str, job: jobs.Job, config: str | None) -> list[str]:
    """Warnings for the local files (the config as given, the data paths) the nodes would not find where the job
    says they are; SLURM without --shared: that the folder emitted from is not known to be shared."""
    cwd, out = os.getcwd(), []
    if kind == "slurm" and not job.shared_given:
        out.append(
            f"warning: no --shared: the job runs in {cwd} and writes under it; every node must see this folder at "
            "this path (fsdp-tune cannot tell that they do); --shared FOLDER names a folder they share"
        )
    for label, path in [*([("--config", config)] if config else []), *(("data", p) for p in job.data_paths)]:
        said = _unreachable(row, kind, job, label, path, cwd)
        out += [f"warning: {label} {path}: {said}"] if said else []
    return out


def _unreachable(row: Emitter, kind: str, job: jobs.Job, label: str, path: str, cwd: str) -> str | None:
    full = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    if kind == "slurm":
        if not job.shared_given:
            return None
        if label == "data" and not os.path.isabs(path) and os.path.normpath(job.workdir) != os.path.normpath(cwd):
            return (
                f"relative, and the job runs in {job.workdir} (--chdir, the shared folder), where it names "
                f"{os.path.join(job.workdir, path)}, not {full} checked here: give it as an absolute path under "
                f"{job.shared}, or emit from the folder under {job.shared} that holds it"
            )
        if not _under(full, job.shared):
            return (
                f"the nodes read {full}, which is not under --shared {job.shared}: copy it there, or make sure "
                "every node sees it at this path"
            )
        return None
    if _under(full, row.mount or "/"):
        return None
    if kind == "skypilot":
        if _under(full, cwd) and not os.path.isabs(path):
            return None  # in workdir, synced to every node
        return (
            f"neither in the synced workdir ({cwd}) nor under {row.mount}: the nodes will not have it; copy it "
            "into this folder, or into the bucket and name it under /shared"
        )
    return (
        f"the nodes read it from the image's working folder: --image {job.image} must hold it at {path} "
        f"(or put it on the PersistentVolumeClaim and name it under {row.mount})"
    )


def _under(path: str, folder: str) -> bool:
    try:
        Path(os.path.abspath(path)).resolve().relative_to(Path(os.path.abspath(folder)).resolve())
    except ValueError:
        return False
    return True


def job_name(output_dir: str) -> str:
    base = os.path.basename(os.path.normpath(output_dir)).lower()
    cleaned = "".join(c if c.isascii() and c.isalnum() else "-" for c in base).strip("-")  # a DNS-1123 label
    return (cleaned or "fsdp-tune")[:40].strip("-")


def token_hint(kind: str) -> str:
    return {
        "slurm": "export HF_TOKEN before sbatch (sbatch passes your environment)",
        "skypilot": "pass it at launch: --secret HF_TOKEN (the task declares it)",
        "kubeflow": "kubectl create secret generic hf-token --from-literal=token=... (the TrainJob reads it)",
    }[kind]


def pf085(key: str, message: str, hint: str) -> Finding:
    return Finding("PF095", Severity.ERROR, key, "command line", message, hint)
