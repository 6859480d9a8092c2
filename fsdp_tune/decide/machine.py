"""What this machine offers the ranks, found without importing torch (which costs seconds on the launcher).

The rank spec is decided from a Machine, so tests describe GPU machines as data (Machine(gpus=8, ...))
and check the decisions without one.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    cuda: bool  # NVIDIA devices are present (whether or not this run uses them)
    gpus: int | None  # GPUs the ranks would see (narrowed by CUDA_VISIBLE_DEVICES); None when it cannot be told
    gpu_names: tuple[str, ...] = ()  # every GPU of the host, as nvidia-smi names them, when it could be asked
    cuda_visible_devices: str | None = None  # the launcher's own CUDA_VISIBLE_DEVICES, if set
    driver_version: str | None = None  # the NVIDIA driver's, from nvidia-smi
    omp_num_threads: str | None = None  # the launcher's own OMP_NUM_THREADS, if set (torchrun keeps it)
    gpu_memory_mib: tuple[int, ...] = ()  # each GPU's total memory, as nvidia-smi reports it (same order as names)

    @classmethod
    def cpu_only(cls) -> Machine:
        return cls(cuda=False, gpus=0)


def cuda_present(env: dict[str, str] | None = None) -> bool:
    """NVIDIA devices this process may use: device nodes or nvidia-smi, unless CUDA_VISIBLE_DEVICES hides them."""
    env = os.environ if env is None else env
    if env.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None


def visible_gpus(cuda_visible_devices: str | None) -> int | None:
    """How many GPUs the ranks will see: device nodes, narrowed by CUDA_VISIBLE_DEVICES; None when that
    cannot be told without CUDA (no /dev/nvidia* nodes, e.g. some containers)."""
    if cuda_visible_devices is not None:
        return len([d for d in cuda_visible_devices.split(",") if d.strip() and d.strip() != "-1"])
    nodes = glob.glob("/dev/nvidia[0-9]*")
    return len(nodes) or None


def _gpus_and_driver() -> tuple[tuple[str, ...], str | None, tuple[int, ...]]:
    """(GPU names, driver version, total memory in MiB of each) from nvidia-smi (a few tens of ms); empty when it
    is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return (), None, ()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return (), None, ()
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not rows:
        return (), None, ()
    memory = tuple(int(r[2]) for r in rows if len(r) > 2 and r[2].isdigit())
    return tuple(r[0] for r in rows), (rows[0][1] if len(rows[0]) > 1 else None), memory


def probe() -> Machine:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    cuda = cuda_present()
    names, driver, memory = _gpus_and_driver() if cuda else ((), None, ())
    return Machine(
        cuda=cuda,
        gpus=visible_gpus(visible) if cuda else 0,
        gpu_names=names,
        cuda_visible_devices=visible,
        driver_version=driver,
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        gpu_memory_mib=memory if len(memory) == len(names) else (),
    )


def available_ram_gib(meminfo: str = "/proc/meminfo") -> float | None:
    """RAM a new run can take on this machine (MemAvailable, GiB); None where the kernel does not say."""
    return ram_gib("MemAvailable", meminfo)


def ram_gib(field: str, meminfo: str = "/proc/meminfo") -> float | None:
    """A /proc/meminfo field (MemTotal, MemAvailable) in GiB; None where the kernel does not say."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 2**20  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def needs_nccl_p2p_off(machine: Machine) -> bool:
    """accelerate's check_cuda_p2p_ib_support (utils/environment.py): RTX 40-series cards with a driver older
    than 550.40.07 cannot use NCCL's P2P/IB paths; every rank's PartialState refuses to start on such a host
    unless NCCL_P2P_DISABLE and NCCL_IB_DISABLE are set, which `accelerate launch` does (and torchrun does not)."""
    if len(machine.gpu_names) <= 1 or not any("RTX 40" in n for n in machine.gpu_names):
        return False
    if not machine.driver_version:
        return True  # cannot tell: the safe side (slower collectives, never a refusal)
    try:
        return tuple(int(x) for x in machine.driver_version.split(".")[:3]) < (550, 40, 7)
    except ValueError:
        return True
