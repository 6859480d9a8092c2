"""LaunchPlan: everything decided before a process starts. Pure (no torch), so it is printed by
`--dry_run`, written to OUTPUT_DIR/fsdp_tune_resolved.json, and tested without spawning anything."""

from __future__ import annotations

import glob
import os
import shutil
import sys
from dataclasses import asdict, dataclass

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.resolve import gradient_checkpointing
from fsdp_tune.worker_paths import RESOLVED_NAME


def cuda_present() -> bool:
    """A cheap look for NVIDIA devices, without importing torch (which costs seconds on the launcher)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None


def visible_gpus(env: dict[str, str] | None = None) -> int | None:
    """How many GPUs the ranks will see (device nodes, narrowed by CUDA_VISIBLE_DEVICES, the plan's first);
    None when that cannot be told without CUDA (no /dev/nvidia* nodes, e.g. some containers)."""
    visible = (env or {}).get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    nodes = glob.glob("/dev/nvidia[0-9]*")
    return len(nodes) or None


@dataclass(frozen=True)
class LaunchPlan:
    world_size: int
    nnodes: int
    nproc_per_node: int
    node_rank: int
    master_addr: str
    master_port: int
    rdzv_backend: str
    standalone: bool
    max_restarts: int
    on_cpu: bool
    backend: str
    output_dir: str
    resolved_path: str
    resume_from_checkpoint: str | None
    gradient_checkpointing: bool
    env: dict[str, str]  # set for torchrun and the ranks, as `accelerate launch` would

    def torchrun_args(self) -> list[str]:
        args = [
            f"--nproc_per_node={self.nproc_per_node}",
            f"--max_restarts={self.max_restarts}",
            f"--log_dir={os.path.join(self.output_dir, 'logs', 'torchrun')}",
        ]
        if self.standalone:
            args.append("--standalone")
        elif self.rdzv_backend == "static":
            args += [
                f"--nnodes={self.nnodes}",
                f"--node_rank={self.node_rank}",
                f"--master_addr={self.master_addr}",
                f"--master_port={self.master_port}",
            ]
        else:
            args += [
                f"--nnodes={self.nnodes}",
                f"--rdzv_backend={self.rdzv_backend}",
                f"--rdzv_endpoint={self.master_addr}:{self.master_port}",
                "--rdzv_id=fsdp-tune",
            ]
        return args

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *self.torchrun_args(),
            "-m",
            "fsdp_tune.worker",
            self.resolved_path,
        ]

    def as_dict(self) -> dict:
        return asdict(self)


def make_plan(cfg: RunConfig, resume: str | None = None, force_cpu: bool | None = None) -> LaunchPlan:
    lc = cfg.launch
    on_cpu = lc.use_cpu or not cuda_present() if force_cpu is None else force_cpu
    output_dir = os.path.abspath(str(cfg.training.get("output_dir") or "fsdp-tune-output"))
    single = lc.num_machines == 1
    return LaunchPlan(
        world_size=lc.num_processes,
        nnodes=lc.num_machines,
        nproc_per_node=lc.nproc_per_node,
        node_rank=lc.machine_rank,
        master_addr=lc.main_process_ip or "127.0.0.1",
        master_port=lc.main_process_port,
        rdzv_backend=lc.rdzv_backend,
        # one machine and no port asked for: let torchrun pick a free port (two runs can share a host)
        standalone=single and not cfg.is_set("launch.main_process_port"),
        max_restarts=lc.max_restarts,
        on_cpu=on_cpu,
        backend="gloo" if on_cpu else "nccl",
        output_dir=output_dir,
        # one file per machine: with a shared output dir, machines must not overwrite each other's plan
        resolved_path=os.path.join(output_dir, RESOLVED_NAME if single else f"node{lc.machine_rank}-{RESOLVED_NAME}"),
        resume_from_checkpoint=resume,
        gradient_checkpointing=gradient_checkpointing(cfg),
        env=rank_env(cfg, on_cpu),
    )


def rank_env(cfg: RunConfig, on_cpu: bool) -> dict[str, str]:
    """What accelerate launch exports for the config's launch keys (accelerate/utils/launch.py), so the
    ranks' Accelerator behaves the same: GPU selection, CPU affinity, collective checks, torch.compile."""
    lc = cfg.launch
    env: dict[str, str] = {}
    if lc.gpu_ids and lc.gpu_ids != "all" and not on_cpu:
        env["CUDA_VISIBLE_DEVICES"] = lc.gpu_ids
    if lc.enable_cpu_affinity:
        env["ACCELERATE_CPU_AFFINITY"] = "1"
    if lc.accelerate_debug:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if lc.dynamo_backend.lower() != "no":
        env.update(
            ACCELERATE_DYNAMO_BACKEND=lc.dynamo_backend.upper(),
            ACCELERATE_DYNAMO_MODE=lc.dynamo_mode,
            ACCELERATE_DYNAMO_USE_FULLGRAPH=str(lc.dynamo_use_fullgraph),
            ACCELERATE_DYNAMO_USE_DYNAMIC=str(lc.dynamo_use_dynamic),
            ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=str(lc.dynamo_use_regional_compilation),
        )
    return env
