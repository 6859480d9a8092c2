"""A Job as a Kubeflow Trainer TrainJob (trainer.kubeflow.org/v1alpha1) on the torch-distributed runtime.

The torch runtime sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT in the
trainer container (schedulers/topology.py reads them), so the container runs `fsdp-tune train` itself, the same
line on every node; fsdp-tune starts torchrun. The shared folder is a ReadWriteMany PersistentVolumeClaim mounted
at /shared through runtimePatches, which also set the pods' terminationGracePeriodSeconds: Kubernetes sends
SIGTERM to the container's first process (fsdp-tune, which handles it) and SIGKILL after the grace. A pod that
fails is restarted as the runtime's JobSet failurePolicy says (a TrainJob cannot set it); the restarted pod's
line continues with `--resume_from_checkpoint latest`. Checked against the TrainJob CRD's schema (vendored).
"""

from __future__ import annotations

from fsdp_tune.schedulers import jobtext
from fsdp_tune.schedulers.job import Job

RUNTIME = "torch-distributed"  # Kubeflow Trainer's ClusterTrainingRuntime for torch
NODE = "node"  # the runtime's replicated job and container (constants.Node)
VOLUME = "shared"


def train_job(job: Job) -> dict:
    requests: dict = {"cpu": str(job.cpus), "memory": f"{job.memory_gib}Gi"}
    limits: dict = {}
    if job.gpu:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = job.procs_per_node
    env = [{"name": k, "value": v} for k, v in job.env.items()]
    env.append(
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}}}
    )
    pod = {
        "terminationGracePeriodSeconds": job.grace_s,
        "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": job.shared}}],
        "containers": [{"name": NODE, "volumeMounts": [{"name": VOLUME, "mountPath": job.mount}]}],
    }
    patch = {"replicatedJobs": [{"name": NODE, "template": {"spec": {"template": {"spec": pod}}}}]}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": job.name},
        "spec": {
            "runtimeRef": {"name": RUNTIME},
            "trainer": {
                "image": job.image,
                "command": ["fsdp-tune"],
                "args": list(job.argv),
                "numNodes": job.nodes,
                "numProcPerNode": job.procs_per_node,
                "resourcesPerNode": {"requests": requests, **({"limits": limits} if limits else {})},
                "env": env,
            },
            "runtimePatches": [{"manager": "fsdp-tune", "trainingRuntimeSpec": {"template": {"spec": patch}}}],
        },
    }


def _local(job: Job) -> list[str]:
    """The config and the local data paths the image must hold: those not on the shared volume."""
    paths = [*([job.config] if job.config else []), *job.data_paths]
    return [p for p in paths if not (p == job.mount or p.startswith(job.mount.rstrip("/") + "/"))]


def render(job: Job) -> str:
    jobtext.check_job(job)
    header = [
        "Written by `fsdp-tune train ... --emit kubeflow`; nothing was applied. Apply: kubectl apply -f THIS_FILE",
        *job.facts,
        f"shared PersistentVolumeClaim {job.shared} (ReadWriteMany) at {job.mount}; output: {job.output_dir}",
        "the image's working folder holds the config and local data files; HF_TOKEN from the secret hf-token",
    ]
    if _local(job):
        header.append("files the image must hold (a relative path: in its working folder): " + ", ".join(_local(job)))
    if job.pins:
        header.append(f"validated with {', '.join(f'{k} {v}' for k, v in job.pins.items())}: the image's should match")
    return jobtext.yaml_file(header, train_job(job))
