"""FSDP2 units made the way accelerate 1.15 makes them (fsdp2_apply_ac, fsdp2_prepare_model), on a model whose
parameters are still on the meta device, and then each rank's shard of every parameter filled from the checkpoint,
layer by layer (named_parameters order), keeping the Parameter objects FSDP2 holds."""

from __future__ import annotations

import torch
from torch import nn

from fsdp_tune.worker.loading.files import Checkpoint, FallbackRequired, checkpoint_key
from fsdp_tune.worker.loading.four_bit import Packed, quant_state, quantize_shard


def layer_classes(model: nn.Module, names) -> tuple[type, ...]:
    """The classes named (accelerate finds them by name in the model and wraps their instances)."""
    found = {type(m) for m in model.modules() if type(m).__name__ in set(names)}
    if not found:
        raise FallbackRequired(f"no module of class {', '.join(sorted(names))} in the model to make FSDP units of")
    return tuple(found)


def apply_ac(model: nn.Module, classes: tuple[type, ...], offload: bool) -> None:
    """fsdp2_apply_ac: a checkpoint_wrapper around each decoder layer (and offload_wrapper when asked)."""
    from accelerate.utils.other import get_module_children_bottom_up
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper, offload_wrapper

    for name, layer in get_module_children_bottom_up(model, return_fqns=True)[:-1]:
        if isinstance(layer, classes):
            wrapped = checkpoint_wrapper(layer, preserve_rng_state=False)
            model.set_submodule(name, offload_wrapper(wrapped) if offload else wrapped)


def apply_fsdp2(model: nn.Module, classes: tuple[type, ...], **kw) -> None:
    """fsdp2_prepare_model's units: each decoder layer bottom-up, the input embedding alone unless tied, the
    tail [final norm, (embedding,) output head] without resharding after forward, the root without
    reshard_after_forward. kw: reshard_after_forward, offload_policy, mp_policy, mesh."""
    from accelerate.utils.fsdp_utils import _find_final_norm
    from accelerate.utils.other import get_module_children_bottom_up
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for module in get_module_children_bottom_up(model)[:-1]:
        if isinstance(module, classes) and not isinstance(module, FSDPModule):
            fully_shard(module, **kw)
    embed = getattr(model, "get_input_embeddings", lambda: None)()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    embed_weight = getattr(embed, "weight", None)
    tied = embed_weight is not None and embed_weight is getattr(head, "weight", None)
    if not tied and embed is not None and not isinstance(embed, FSDPModule):
        fully_shard(embed, **kw)
    norm = _find_final_norm(model)
    tail = (norm, embed, head) if tied else (norm, head)
    tail = [m for m in tail if m is not None and not isinstance(m, FSDPModule)]
    if tail:
        fully_shard(tail, **{**kw, "reshard_after_forward": False})
    if not isinstance(model, FSDPModule):
        fully_shard(model, **{k: v for k, v in kw.items() if k != "reshard_after_forward"})


def local_rows(p) -> tuple[int, int, tuple[int, ...]]:
    """(first row, row count, local shape) of this rank's shard of DTensor `p` (Shard(0) and/or Replicate)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    for pl in p.placements:
        if not isinstance(pl, (Replicate, Shard)) or (isinstance(pl, Shard) and pl.dim != 0):
            raise FallbackRequired(f"placement {p.placements} is not dim-0 sharding")
    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    if any(offset[1:]) or tuple(shape[1:]) != tuple(p.shape[1:]):
        raise FallbackRequired(f"unexpected shard layout {shape} at {offset} of {tuple(p.shape)}")
    return (offset[0], shape[0], tuple(shape)) if len(shape) else (0, 1, ())


def swap_in(p: nn.Parameter, local: torch.Tensor) -> None:
    """Make the meta DTensor parameter `p` hold `local` as its shard while staying the same Parameter object (as
    to_empty() does): FSDP2 re-reads it at lazy init (FSDPParam.reset_sharded_param pads and pins it).

    Built the way FSDP2 builds its own shards (_fsdp_common._from_local_no_grad: DTensor(local, spec)), so the
    shard stays where it was read to: DTensor.from_local would move it to the mesh's device, putting every
    offloaded shard on the GPU while loading, and FSDP2's lazy init would then find a DTensor that says cuda over
    pinned host memory ("FSDP parameters should be materialized on CPU when enabling CPU offloading")."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    spec = DTensorSpec(p.device_mesh, p.placements, tensor_meta=TensorMeta(p.shape, p.stride(), local.dtype))
    new = DTensor(local, spec, requires_grad=False)
    torch.utils.swap_tensors(p, nn.Parameter(new, requires_grad=p.requires_grad))


def fill(model: nn.Module, ckpt: Checkpoint, prefix: str, packed: dict[int, Packed], new_rows: dict, devices, qdtype):
    """Fill every meta parameter with this rank's rows, in model order, one tensor in flight; tied weights once.
    devices: (compute device, device the shards live on); qdtype: the dtype 4-bit weights are quantized from.
    Returns (parameters filled, of which 4-bit)."""
    device, keep = devices
    seen, loaded, quantized, read = set(), 0, 0, 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if id(p) in seen or not p.is_meta:
                continue
            seen.add(id(p))
            key = checkpoint_key(name, prefix)
            owner = model.get_submodule(name.rpartition(".")[0])
            if id(owner) in packed and name.endswith(".weight"):
                local, absmax = quantize_shard(p, packed[id(owner)], ckpt, key, qdtype, device, keep)
                swap_in(p, local)
                owner.quant_state = quant_state(absmax, packed[id(owner)], qdtype)
                quantized += 1
                read += local.numel() * 2 * local.element_size() * qdtype.itemsize  # the values quantized
            else:
                local = _rows_of(p, ckpt, key, new_rows.get(id(owner)), keep)
                swap_in(p, local)
                read += local.nbytes
            loaded += 1
            if read >= TRIM_EVERY_BYTES:
                release_freed_memory()
                read = 0
        for name, b in model.named_buffers():  # persistent buffers the checkpoint carries: whole
            key = checkpoint_key(name, prefix)
            if b is not None and key in ckpt:
                b.copy_(ckpt.rows(key, 0, ckpt.shape(key)[0] if ckpt.shape(key) else 0))
    release_freed_memory()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"still on the meta device after sharded loading: {left[:5]}")
    return loaded, quantized


# Trim the heap after every this many bytes read: what the freed reads may leave in RSS at most (a trim walks
# the whole heap: after every tensor it cost 1-1.5 s on the 443M benchmark model)
TRIM_EVERY_BYTES = 16 * 2**20


def release_freed_memory() -> None:
    """Hand the heap's freed chunks back to the OS (glibc's malloc_trim): glibc raises its mmap threshold to the
    size of each large buffer freed, so the next reads land in the heap and their freed pages stay in the rank's
    RSS; without this the slices read so far pile up (measured: QLoRA's loading peak 0.34-0.38x the checkpoint
    at 2 ranks instead of 0.19x). No-op where the C library has no malloc_trim."""
    global _TRIM
    if _TRIM is None:
        import ctypes
        import ctypes.util

        try:
            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM = None


def _rows_of(p, ckpt: Checkpoint, key: str, grown, keep) -> torch.Tensor:
    """This rank's rows of `p`: from the checkpoint, and past its end from the rows a vocabulary resize drew."""
    start, count, shape = local_rows(p)
    local = torch.empty(shape, dtype=p.dtype, device=keep)
    if not local.numel():
        return local
    if p.dim() == 0:
        local.copy_(ckpt.rows(key, 0, 0))
        return local
    have, stop = ckpt.shape(key)[0], start + count
    if start < have:
        local[: min(stop, have) - start].copy_(ckpt.rows(key, start, min(stop, have)))
    if stop > have:
        lo = max(start, have)
        local[lo - start :].copy_(grown[lo - have : stop - have])
    return local
