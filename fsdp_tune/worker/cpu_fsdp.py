"""The CPU shim: let accelerate take its FSDP path on a machine without an accelerator, on the CPU.

torch's FSDP2 (`fully_shard`) runs on CPU over gloo, but accelerate's `AcceleratorState` enables FSDP
only for accelerator device types: on CPU it keeps `DistributedType.MULTI_CPU` and drops the plugin,
so Trainer would silently train unsharded. This module re-applies, after the original `__init__`, the
same three assignments accelerate makes for GPUs (state.py, the MULTI_GPU/... branch). It is installed
only for CPU runs, only on accelerate versions it was checked against (sources/versions.py FACTS["cpu_shim"]: the
pre-flight refuses any other before a rank starts, PF029), and only once.

It also makes fully_shard's default device mesh (used when no mesh is given: one process, where accelerate builds
none because every size is 1) a CPU mesh: torch builds it on `torch._C._get_accelerator()`, which on a CUDA
build of torch is cuda even in a CPU run (DeviceMesh then calls torch.cuda.set_device, and fails where the GPUs
are hidden). Runs of several processes get an explicit CPU mesh in the rank spec (decide/rank.py mesh).
"""

from __future__ import annotations

import functools

from fsdp_tune.sources.versions import fact_hint, fact_holds, fact_message


def install() -> bool:
    """Patch AcceleratorState so a CPU run with an FSDP plugin becomes an FSDP run. Returns True if active."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if getattr(AcceleratorState.__init__, "_fsdp_tune_cpu_shim", False):
        return True
    holds, found = fact_holds("cpu_shim")
    if not holds:  # the pre-flight refused it already (PF029); a rank spec run by hand gets the same words
        raise RuntimeError(f"{fact_message('cpu_shim', found)}: {fact_hint('cpu_shim')}")
    original = AcceleratorState.__init__

    @functools.wraps(original)
    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if (
            fsdp_plugin is not None
            and self.distributed_type == DistributedType.MULTI_CPU
            and getattr(self, "fsdp_plugin", None) is None
        ):
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            # as accelerate does at the end of the branch it mirrors (state.py): every later bare AcceleratorState()
            # copies PartialState's distributed_type back, which would turn the run into MULTI_CPU again (and wrap a
            # model prepared after that in DDP: DPO's reference pass under autocast does it before train())
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    __init__._fsdp_tune_cpu_shim = True  # type: ignore[attr-defined]
    AcceleratorState.__init__ = __init__
    default_mesh_on_cpu()
    return True


def default_mesh_on_cpu() -> None:
    """fully_shard without a mesh: a 1-D mesh of every rank on the CPU (torch 2.6-2.13's `_init_default_mesh`,
    looked up in fully_shard's module when it is called)."""
    from torch.distributed.fsdp._fully_shard import _fully_shard as module

    if not hasattr(module, "_init_default_mesh"):
        import torch

        raise RuntimeError(
            f"torch {torch.__version__}: fully_shard no longer builds its default mesh through _init_default_mesh; "
            "fsdp-tune's CPU shim needs updating (install the torch version in constraints.txt)"
        )

    def cpu_mesh(mesh_dim_names: tuple[str, ...] | None = None):
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        return init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=mesh_dim_names)

    module._init_default_mesh = cpu_mesh
