"""Processes, machines and rendezvous."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import Derived
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.rules.registry import error, finding, rule, warning


@rule("FT090", "launch", "process and machine counts")
def counts(cfg: RunConfig) -> Iterator[Finding]:
    lc = cfg.launch
    if lc.num_processes < 1:
        yield error(
            cfg,
            "FT090",
            "launch.num_processes",
            f"num_processes must be at least 1, got {lc.num_processes}",
            "--num_processes N (the total over all machines)",
        )
    if lc.num_machines < 1:
        yield error(cfg, "FT090", "launch.num_machines", f"num_machines must be at least 1, got {lc.num_machines}")
    elif lc.num_processes >= 1 and lc.num_processes % lc.num_machines:
        yield error(
            cfg,
            "FT090",
            "launch.num_processes",
            f"num_processes {lc.num_processes} is not divisible by num_machines {lc.num_machines} "
            "(accelerate silently floors the per-machine count)",
            "num_processes counts all machines: use "
            f"{lc.num_processes // lc.num_machines * lc.num_machines or lc.num_machines}",
        )
    if lc.max_restarts < 0:
        yield error(cfg, "FT090", "launch.max_restarts", f"max_restarts must be >= 0, got {lc.max_restarts}")


@rule("FT091", "launch", "machine_rank must be in [0, num_machines)")
def machine_rank(cfg: RunConfig) -> Iterator[Finding]:
    lc = cfg.launch
    if lc.num_machines >= 1 and not 0 <= lc.machine_rank < lc.num_machines:
        yield error(
            cfg,
            "FT091",
            "launch.machine_rank",
            f"machine_rank {lc.machine_rank} is outside [0, {lc.num_machines}) for {lc.num_machines} machines",
            f"--machine_rank 0..{lc.num_machines - 1}",
        )


@rule("FT092", "launch", "multi-node needs the main process address")
def multinode_address(cfg: RunConfig) -> Iterator[Finding]:
    lc = cfg.launch
    if lc.num_machines > 1 and not lc.main_process_ip:
        yield error(
            cfg,
            "FT092",
            "launch.num_machines",
            f"{lc.num_machines} machines need main_process_ip, the address of machine 0",
            "--main_process_ip 10.0.0.1 --main_process_port 29500",
        )
    if not 0 < lc.main_process_port < 65536:
        yield error(
            cfg,
            "FT092",
            "launch.main_process_port",
            f"port {lc.main_process_port} is not a TCP port",
            "--main_process_port 29500",
        )


@rule("FT093", "launch", "one process shards nothing")
def single_process(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.launch.num_processes == 1 and cfg.launch.num_machines == 1:
        yield finding(
            cfg,
            "FT093",
            Severity.NOTE,
            "launch.num_processes",
            "one process: FSDP runs but shards nothing (useful for tests and the GPU check)",
            "--num_processes N for N GPUs",
        )


# accelerate's DynamoBackend values (accelerate/utils/dataclasses.py)
DYNAMO_BACKENDS = (
    "NO EAGER AOT_EAGER INDUCTOR AOT_TS_NVFUSER NVPRIMS_NVFUSER CUDAGRAPHS OFI FX2TRT ONNXRT TENSORRT "
    "AOT_TORCHXLA_TRACE_ONCE TORCHXLA_TRACE_ONCE TVM HPU_BACKEND NEURON"
).split()


@rule(
    "FT094", "launch", "GPU selection and torch.compile keys that accelerate launch passes to the ranks", decided=True
)
def launch_env(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    lc = cfg.launch
    if lc.dynamo_backend.upper() not in DYNAMO_BACKENDS:
        yield error(
            cfg,
            "FT094",
            "launch.dynamo_backend",
            f"unknown dynamo backend {lc.dynamo_backend!r} (accelerate would refuse it at launch)",
            "one of: " + ", ".join(b.lower() for b in DYNAMO_BACKENDS[:5]) + ", ...",
        )
    if lc.dynamo_backend.lower() == "no":
        for name in ("dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation"):
            if cfg.is_set(f"launch.{name}"):
                yield warning(
                    cfg,
                    "FT094",
                    f"launch.{name}",
                    "ignored: torch.compile is off (dynamo_backend is no), so accelerate passes none of its settings",
                    "set dynamo_backend (e.g. inductor), or remove it",
                )
    if not lc.gpu_ids or lc.gpu_ids == "all":
        return
    if d.on_cpu:
        yield finding(cfg, "FT094", Severity.NOTE, "launch.gpu_ids", "gpu_ids has no effect on a CPU run")
        return
    ids = [part.strip() for part in str(lc.gpu_ids).split(",") if part.strip()]
    if not all(part.isdigit() for part in ids) or len(set(ids)) != len(ids):
        yield error(
            cfg,
            "FT094",
            "launch.gpu_ids",
            f"gpu_ids {lc.gpu_ids!r}: expected `all` or distinct GPU indices",
            "gpu_ids: 0,1,2,3",
        )
    elif len(ids) < lc.nproc_per_node:
        yield error(
            cfg,
            "FT094",
            "launch.gpu_ids",
            f"gpu_ids names {len(ids)} GPU(s) but {lc.nproc_per_node} processes run on each machine: the extra "
            "ranks would find no device",
            f"list {lc.nproc_per_node} GPUs, or --num_processes {len(ids) * lc.num_machines}",
        )
    elif len(ids) > lc.nproc_per_node:
        yield finding(
            cfg,
            "FT094",
            Severity.NOTE,
            "launch.gpu_ids",
            f"gpu_ids names {len(ids)} GPUs; {lc.nproc_per_node} process(es) per machine use the first "
            f"{lc.nproc_per_node}",
        )
