"""A Job as a SkyPilot task (`sky jobs launch THIS_FILE`): num_nodes nodes, each running the same line.

SkyPilot sets SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS, SKYPILOT_NUM_NODES and SKYPILOT_NUM_GPUS_PER_NODE on every
node (schedulers/topology.py reads them). The shared folder is a bucket mounted at /shared (MOUNT_CACHED: written
locally, uploaded behind, the mode SkyPilot documents for checkpoints). Preemption: a managed job is recovered on
a new cluster and runs `run` again, which continues with `--resume_from_checkpoint latest`; exit 143 (stopped,
checkpoint written) is recovered too (`recover_on_exit_codes`). The stop before preemption is SkyPilot's
preemption hook (config.hooks, SkyPilot 0.14): it writes the run's stop file on the shared folder, which every
rank polls at each step end (worker/training/callbacks.py), within the hook's timeout (the grace). By reading
SkyPilot's schema and code only: no SkyPilot cluster ran it.
"""

from __future__ import annotations

from fsdp_tune.runfiles import STOP_FILE
from fsdp_tune.schedulers import jobtext
from fsdp_tune.schedulers.job import Job

# the planner's GPUs as SkyPilot names them (its accelerator catalog)
ACCELERATORS = {"h100": "H100", "h200": "H200", "a100": "A100-80GB", "4090": "RTX4090"}
STOPPED = 143


def task(job: Job) -> dict:
    resources: dict = {"memory": f"{job.memory_gib}+", "cpus": f"{job.cpus}+"}
    if job.gpu:
        resources["accelerators"] = f"{ACCELERATORS[job.gpu]}:{job.procs_per_node}"
    resources["job_recovery"] = {"max_restarts_on_errors": 0, "recover_on_exit_codes": [STOPPED]}
    stop = f"{job.output_dir.rstrip('/')}/{STOP_FILE}"
    hook = f"{jobtext.shell_line(['mkdir', '-p', job.output_dir])} && echo 15 > {jobtext.shell_line([stop])}"
    return {
        "name": job.name,
        "num_nodes": job.nodes,
        "resources": resources,
        "workdir": ".",
        "file_mounts": {job.mount: {"name": job.shared, "mode": "MOUNT_CACHED"}},
        "envs": dict(job.env),
        "secrets": {"HF_TOKEN": None},  # given at launch (--secret HF_TOKEN) when the model or the push needs it
        "config": {
            "hooks": [
                {
                    "run": hook,
                    "events": ["preemption"],
                    "timeout": job.grace_s,
                }
            ]
        },
        "setup": setup(job),
        "run": jobtext.shell_line(["fsdp-tune", *job.argv]),
    }


def setup(job: Job) -> str:
    """pip install of fsdp-tune and torch at the versions this launch was validated with (unpinned where this
    machine has none); torch's build for the node's CUDA is pip's choice."""
    words = [f"{name}=={job.pins[name]}" if name in job.pins else name for name in ("fsdp-tune", "torch")]
    said = "the versions this launch was validated with" if job.pins else "not pinned: no version found here"
    return f"{jobtext.shell_line(['python', '-m', 'pip', 'install', *words])}  # {said}; or your own install"


def render(job: Job) -> str:
    jobtext.check_job(job)
    header = [
        "Written by `fsdp-tune train ... --emit skypilot`; nothing was launched. Launch: sky jobs launch THIS_FILE",
        *job.facts,
        f"shared bucket {job.shared} at {job.mount} (output, checkpoints, HF cache); output: {job.output_dir}",
        "workdir . is synced to every node: the config and local data files are read from it",
    ]
    return jobtext.yaml_file(header, task(job))
