"""FSDP1's adapter, one unit at a time: the final save and resume's reload without torch's full state dict.

torch's full state dict of an FSDP1 model gathers the whole model into rank 0's host memory, and for a unit that is
not sharded (NO_SHARD, or one process) it ignores cpu_offload and rank0_only and clones every weight on the GPU
(torch 2.13 fsdp/_state_dict_utils.py, _replace_with_full_state_dict_type): a nearly full card then fails at the very
end of the run. Loading it back with set_model_state_dict refuses a model whose offloaded weights are on the host and
whose buffers are on the GPU ("Multiple devices found", checkpoint/state_dict.py). Instead each FSDP1 unit is
unsharded on its own (`summon_full_params(recurse=False)`: what its forward does, a no-op gather when it is not
sharded), its adapter tensors are copied off (save) or into it (resume, written back to the shard), and it is
resharded: one unit gathered at a time, nothing but the adapter leaves the GPU.

FULL_STATE_DICT checkpoints go through here too (RankSpec.save.checkpoint = "adapter_file"): the Trainer's second
save of the model at each checkpoint, accelerate's save_fsdp_model, takes that same full state dict of the whole
model, and is skipped (worker/training/trainer.py).

Run on CPU: FSDP1 NO_SHARD in one process over gloo (`device_id=cpu`), as accelerate wraps a PEFT model
(tests/lib/test_fsdp1_units_on_cpu.py). fsdp-tune's ranks refuse FSDP1 on CPU, and sharded strategies over several
CPU ranks were not tried: those, and the GPU-memory side, by reading torch 2.13
(scripts/gpu_check.sh's FSDP1 scenarios run them on a GPU). The rank spec decides it (RankSpec.save).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn


def _units(wrapped: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, FSDP1 module) of every unit, the root first."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

    return [(name, m) for name, m in wrapped.named_modules() if isinstance(m, FSDP1)]


def _own_params(unit: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Parameter]]:
    """The unit's own original parameters while it is summoned, with their full names: nested units are theirs
    (and not gathered now), flat parameters are FSDP's storage, not a model parameter."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
    from torch.distributed.fsdp._flat_param import FlatParameter

    def walk(module: nn.Module, at: str) -> Iterator[tuple[str, nn.Parameter]]:
        for name, p in module.named_parameters(recurse=False):
            if not isinstance(p, FlatParameter):
                yield f"{at}{name}", p
        for name, child in module.named_children():
            if not isinstance(child, FSDP1):
                yield from walk(child, f"{at}{name}.")

    yield from walk(unit, f"{prefix}." if prefix else "")


def gather_adapter(wrapped: nn.Module, wanted: Callable[[str, nn.Parameter], bool], canonical) -> dict:
    """CPU copies of the parameters `wanted(canonical name, param)` selects, unit by unit (a collective: every rank
    calls it; every rank gets the copies, which are the adapter's size)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

    out: dict = {}
    for prefix, unit in _units(wrapped):
        with FSDP1.summon_full_params(unit, recurse=False, writeback=False), torch.no_grad():
            for name, p in _own_params(unit, prefix):
                key = canonical(name)
                if key not in out and wanted(key, p):
                    out[key] = p.detach().to("cpu", copy=True).contiguous()
    return out


def load_adapter(wrapped: nn.Module, wanted: Callable[[str, nn.Parameter], bool], canonical, value_of) -> int:
    """Copy `value_of(canonical name)` into every parameter `wanted` selects, unit by unit, written back to each
    rank's shard (every rank calls it). Returns how many tensors were loaded."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

    loaded = 0
    for prefix, unit in _units(wrapped):
        with FSDP1.summon_full_params(unit, recurse=False, writeback=True), torch.no_grad():
            for name, p in _own_params(unit, prefix):
                key = canonical(name)
                if wanted(key, p):
                    p.copy_(value_of(key))
                    loaded += 1
    return loaded
