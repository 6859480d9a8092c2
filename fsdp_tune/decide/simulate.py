"""`train --dry_run --gpu KEY [--gpus N]`: a GPU node as data, so a laptop previews the rank spec and the console that
node would get. decide/rank.py decides from a Machine whichever way it was found (decide/machine.py probes this
one); the node's cards are named as nvidia-smi names them, so train's memory pre-flight plans them as on the node.
Only a dry run takes it: a launch on a machine it is not would lie about it."""

from __future__ import annotations

from fsdp_tune.decide.machine import Machine
from fsdp_tune.errors import UsageError

# the planner's GPUs (decide/gpus.py GPUS) as nvidia-smi names them (preflight/memory.py reads them back)
NVIDIA_NAMES = {
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "a100": "NVIDIA A100-SXM4-80GB",
    "4090": "NVIDIA GeForce RTX 4090",
}
DRIVER = "560.35.03"  # a current driver: no NCCL P2P workaround (decide/machine.py needs_nccl_p2p_off)


def gpu_node(key: str, gpus: int) -> Machine:
    """A node with `gpus` cards of the planner's GPU `key` (its memory as the planner knows it)."""
    from fsdp_tune.decide.gpus import GPUS

    if key not in NVIDIA_NAMES:
        raise UsageError(f"--gpu {key}: unknown", f"one of: {', '.join(NVIDIA_NAMES)}")
    if gpus < 1:
        raise UsageError(f"--gpus {gpus}: a node has at least one GPU", "e.g. --gpus 8, or leave it out")
    mib = int(GPUS[key].memory_gib * 1024)
    return Machine(
        cuda=True,
        gpus=gpus,
        gpu_names=(NVIDIA_NAMES[key],) * gpus,
        driver_version=DRIVER,
        gpu_memory_mib=(mib,) * gpus,
    )


def refuse_without_dry_run(gpu: str | None, gpus: int | None, dry_run: bool) -> None:
    """--gpu/--gpus describe a machine that is not this one: only a preview may use them."""
    if gpus is not None and gpu is None:
        raise UsageError("--gpus needs --gpu: it counts the simulated node's GPUs", "e.g. --dry_run --gpu h100")
    if gpu is not None and not dry_run:
        raise UsageError(
            f"--gpu {gpu} simulates a GPU node: only a dry run can use it (a launch runs on this machine's own GPUs)",
            f"add --dry_run to preview the launch on {gpu} GPUs, or drop --gpu to launch here",
        )


def describe(machine: Machine) -> str:
    n, name, mib = machine.gpus, machine.gpu_names[0], machine.gpu_memory_mib[0]
    return (
        f"  machine: simulated, {n} x {name} ({mib / 1024:.1f} GiB each): the rank spec and memory plan such a node "
        "would get; files, libraries and the Hub are as this machine finds them"
    )
