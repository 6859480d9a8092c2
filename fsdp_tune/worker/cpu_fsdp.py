"""The CPU shim: let accelerate take its FSDP path on a machine without an accelerator.

torch's FSDP2 (`fully_shard`) runs on CPU over gloo, but accelerate's `AcceleratorState` enables FSDP
only for accelerator device types: on CPU it keeps `DistributedType.MULTI_CPU` and drops the plugin,
so Trainer would silently train unsharded. This module re-applies, after the original `__init__`, the
same three assignments accelerate makes for GPUs (state.py, the MULTI_GPU/... branch). It is installed
only for CPU runs, only on accelerate versions it was checked against, and only once.
"""

from __future__ import annotations

import functools

# Checked against accelerate 1.12 .. 1.15 (the branch it mirrors has not changed across these).
SUPPORTED = ((1, 12), (1, 15))


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def is_supported(version: str) -> bool:
    low, high = SUPPORTED
    return low <= _version_tuple(version) <= high


def install() -> bool:
    """Patch AcceleratorState so a CPU run with an FSDP plugin becomes an FSDP run. Returns True if active."""
    import accelerate
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    if getattr(AcceleratorState.__init__, "_fsdp_tune_cpu_shim", False):
        return True
    if not is_supported(accelerate.__version__):
        raise RuntimeError(
            f"fsdp-tune's CPU FSDP shim was checked against accelerate {SUPPORTED[0]}..{SUPPORTED[1]}, "
            f"found {accelerate.__version__}; install the version in constraints.txt to train on CPU"
        )
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

    __init__._fsdp_tune_cpu_shim = True  # type: ignore[attr-defined]
    AcceleratorState.__init__ = __init__
    return True
