"""Peak bytes of live tensors made inside a block, on CPU: a TorchDispatchMode that counts every new
storage an op returns and drops it when the storage is freed (a weak reference's callback), the same
bookkeeping torch.distributed._tools.mem_tracker does (which needs every parameter to require grad).
What it reports is what torch.cuda.max_memory_allocated would for the same ops, less the allocator's
512-byte rounding."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """`existing`: tensors made before the block (parameters, inputs); a view of one (a weight's `.t()`)
    returns their storage, which the block did not allocate."""

    def __init__(self, *existing: torch.Tensor) -> None:
        super().__init__()
        self.now = 0
        self.peak = 0
        self._refs: dict[int, weakref.ref] = {}
        self._existing = {t.untyped_storage().data_ptr() for t in existing}

    def reset_peak(self) -> None:
        self.peak = self.now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self._track(t.untyped_storage())
        return out

    def _track(self, storage) -> None:
        if storage.data_ptr() in self._existing:
            return
        key = id(storage)
        if key in self._refs and self._refs[key]() is storage:
            return
        size = storage.nbytes()

        def freed(_ref, key=key, size=size) -> None:
            self.now -= size
            self._refs.pop(key, None)

        self._refs[key] = weakref.ref(storage, freed)
        self.now += size
        self.peak = max(self.peak, self.now)
