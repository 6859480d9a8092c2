"""Which scheduler variable fills which launch key, as data: one row per variable group.

Sources, read from their own documentation and code:
- SLURM: the OUTPUT ENVIRONMENT VARIABLES of sbatch(1) and srun(1) (tests/fixtures/schedulers/slurm/, vendored
  from SchedMD/slurm). Inside `srun` the step's variables describe the nodes that run it (a step may use fewer
  nodes than the job); in the batch script only the job's exist.
- Kubeflow Trainer: its torch runtime (pkg/runtime/framework/plugins/torch/torch.go) sets PET_NNODES,
  PET_NPROC_PER_NODE (a number, or `auto` when the TrainJob names none), PET_NODE_RANK (the Job completion index),
  PET_MASTER_ADDR (`<trainjob>-node-0-0.<trainjob>`) and PET_MASTER_PORT (29500). PET_<ARG> is torchrun's own
  spelling of its arguments (torch/distributed/argparse_util.py), so torchrun's PET_RDZV_ENDPOINT and
  PET_RDZV_BACKEND are read beside them.
- SkyPilot: SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS (one address a line, the head's first), SKYPILOT_NUM_NODES,
  SKYPILOT_NUM_GPUS_PER_NODE (its docs' "Environment variables" page, as the distributed examples use them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fsdp_tune.schedulers.hostlist import HostlistError, expand

# the launch keys a scheduler can fill, and the config path each one sets
KEYS = {
    "num_machines": "launch.num_machines",
    "machine_rank": "launch.machine_rank",
    "main_process_ip": "launch.main_process_ip",
    "main_process_port": "launch.main_process_port",
    "rdzv_backend": "launch.rdzv_backend",
    "nproc_per_node": "launch.num_processes",  # as num_machines x nproc_per_node (accelerate counts the total)
}


def count(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError("negative")
    return value


def nnodes(text: str) -> int:
    """torchrun's --nnodes: N, or MIN:MAX (elastic); an elastic range fsdp-tune does not launch, unless MIN == MAX."""
    low, _, high = text.strip().partition(":")
    if high and count(low) != count(high):
        raise ValueError(f"an elastic range ({text}); fsdp-tune launches a fixed number of machines")
    return count(low)


def nproc(text: str) -> int | None:
    """torchrun's --nproc_per_node: a number, or auto/gpu/cpu/xpu (torchrun counts this node's devices): None."""
    if text.strip().lower() in ("auto", "gpu", "cpu", "xpu", "cuda"):
        return None
    return count(text)


def gpus(text: str) -> int | None:
    """GPUs the scheduler gave this node; 0 (a CPU job) says nothing about the processes."""
    return count(text) or None


def port(text: str) -> int:
    value = count(text)
    if not 0 < value < 65536:
        raise ValueError("not a TCP port")
    return value


def hosts(text: str) -> list[str]:
    try:
        return expand(text)
    except HostlistError as err:
        raise ValueError(str(err)) from None


def first_host(text: str) -> str:
    return hosts(text)[0]


def lines(text: str) -> list[str]:
    out = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not out:
        raise ValueError("no address")
    return out


def first_line(text: str) -> str:
    return lines(text)[0]


def endpoint_host(text: str) -> str:
    host, sep, number = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError("not HOST:PORT")
    port(number)
    return host.strip("[]")


def endpoint_port(text: str) -> int:
    return port(text.strip().rpartition(":")[2])


def backend(text: str) -> str:
    return text.strip()


@dataclass(frozen=True)
class Read:
    """`key` from the first group of `names` with any variable set; every set variable of that group must agree.
    `at_most`: the value is a ceiling (GPUs given), fewer processes per machine are fine."""

    key: str
    names: tuple[tuple[str, ...], ...]
    parse: Callable[[str], object]
    how: str = ""  # how the value is read, for the explanation ("the first host of")
    at_most: bool = False


@dataclass(frozen=True)
class Listed:
    """A list of every machine (SLURM's node list, SkyPilot's IPs): its length must be the machine count, and
    `me` (when set) names this node, which must sit at its machine rank in it."""

    names: tuple[tuple[str, ...], ...]
    parse: Callable[[str], list[str]]
    me: str | None = None


@dataclass(frozen=True)
class Scheduler:
    name: str
    markers: tuple[str, ...]  # any of these set: this scheduler's variables are here, and must be whole
    reads: tuple[Read, ...]
    listed: Listed | None = None
    step: str | None = None  # set only inside the scheduler's per-node launch (srun's step: env.c env_array_for_step)


_SLURM_NODES = (("SLURM_STEP_NUM_NODES",), ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"))
_SLURM_LIST = (("SLURM_STEP_NODELIST",), ("SLURM_JOB_NODELIST", "SLURM_NODELIST"))

SLURM = Scheduler(
    "SLURM",
    markers=("SLURM_JOB_ID", "SLURM_JOBID"),
    reads=(
        Read("num_machines", _SLURM_NODES, count),
        Read("machine_rank", (("SLURM_NODEID",),), count),
        Read("main_process_ip", _SLURM_LIST, first_host, "the first host of "),
        Read("nproc_per_node", (("SLURM_GPUS_ON_NODE",),), gpus, at_most=True),
    ),
    listed=Listed(_SLURM_LIST, hosts, me="SLURMD_NODENAME"),
    step="SLURM_STEP_NUM_NODES",
)

KUBEFLOW = Scheduler(
    "Kubeflow",
    markers=("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NPROC_PER_NODE"),
    reads=(
        Read("num_machines", (("PET_NNODES",),), nnodes),
        Read("machine_rank", (("PET_NODE_RANK",),), count),
        Read("main_process_ip", (("PET_MASTER_ADDR",),), str.strip),
        Read("main_process_port", (("PET_MASTER_PORT",),), port),
        Read("nproc_per_node", (("PET_NPROC_PER_NODE",),), nproc),
        Read("main_process_ip", (("PET_RDZV_ENDPOINT",),), endpoint_host, "the host of "),
        Read("main_process_port", (("PET_RDZV_ENDPOINT",),), endpoint_port, "the port of "),
        Read("rdzv_backend", (("PET_RDZV_BACKEND",),), backend),
    ),
)

SKYPILOT = Scheduler(
    "SkyPilot",
    markers=("SKYPILOT_NODE_RANK", "SKYPILOT_NUM_NODES", "SKYPILOT_NODE_IPS"),
    reads=(
        Read("num_machines", (("SKYPILOT_NUM_NODES",),), count),
        Read("machine_rank", (("SKYPILOT_NODE_RANK",),), count),
        Read("main_process_ip", (("SKYPILOT_NODE_IPS",),), first_line, "the first line of "),
        Read("nproc_per_node", (("SKYPILOT_NUM_GPUS_PER_NODE",),), gpus, at_most=True),
    ),
    listed=Listed((("SKYPILOT_NODE_IPS",),), lines),
)

SCHEDULERS = (KUBEFLOW, SKYPILOT, SLURM)  # the one closer to the job first: SkyPilot may run on a SLURM cluster

# every key a multi-machine job needs from the scheduler whose variables are here (one machine: the first two)
NEEDED = ("num_machines", "machine_rank", "main_process_ip")

# set in the processes torchrun starts: fsdp-tune started by torchrun would start torchrun again on every rank
TORCHRUN_WORKER = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "GROUP_RANK")
