"""QLoRA under sharded loading: every rank quantizes only the values under its own shard of each packed 4-bit
weight, and the quant state comes out exactly as bitsandbytes builds it for the whole weight.

bitsandbytes (0.50) flattens an (out, in) weight row-major, takes one absmax per `blocksize` (64) values and packs
two 4-bit values per byte, viewed as the storage dtype in shape (N, 1). FSDP2 shards that packed parameter on dim 0
like torch.chunk, so a rank owns a contiguous range of packed elements, whose value range need not start or end on
a block. Quantization is block-local (an absmax per block, an elementwise scale, the nearest code), so a rank that
quantizes the block-aligned superset of its values gets exactly the bytes the whole-tensor quantization puts
under its shard. The quant state is the module's and is not sharded (bnb re-attaches it to the all-gathered
weight in every forward): the absmax pieces are all-gathered over the shard group, and the nested quantization of
the absmax (offset = mean, blockwise 8-bit of absmax - offset) is then computed on every rank as
`bitsandbytes.functional.quantize_4bit` computes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fsdp_tune.worker.loading.files import Checkpoint, FallbackRequired


@dataclass(frozen=True)
class Packed:
    """What a Linear4bit's weight is before packing, and how bnb packs it."""

    shape: tuple[int, int]  # (out_features, in_features)
    blocksize: int
    quant_type: str
    nested: bool
    storage: torch.dtype


def pack_meta_weights(model) -> dict[int, Packed]:
    """Give every bnb Linear4bit a meta Params4bit of the packed shape ((out*in/2/itemsize, 1) in the storage
    dtype), so fully_shard shards what training holds. Returns {id(module): Packed}."""
    import bitsandbytes as bnb

    out: dict[int, Packed] = {}
    for module in model.modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        w, storage = module.weight, module.quant_storage
        itemsize = torch.empty((), dtype=storage).element_size()
        if not storage.is_floating_point or w.numel() % 2 or (w.numel() // 2) % itemsize:
            raise FallbackRequired(f"a 4-bit weight of shape {tuple(w.shape)} does not pack into {storage}")
        out[id(module)] = Packed((w.shape[0], w.shape[1]), w.blocksize, w.quant_type, w.compress_statistics, storage)
        module.weight = bnb.nn.Params4bit(
            torch.empty((w.numel() // 2 // itemsize, 1), dtype=storage, device="meta"),
            requires_grad=False,
            blocksize=w.blocksize,
            compress_statistics=w.compress_statistics,
            quant_type=w.quant_type,
            quant_storage=storage,
            module=module,
            bnb_quantized=True,
        )
    return out


def shard_ranges(p) -> tuple[list[tuple[int, int]], object, int]:
    """Packed-element ranges of every rank of the shard group (in group order, torch.chunk's split), the group,
    and this rank's index in it."""
    import torch.distributed as dist
    from torch.distributed.tensor import Shard

    dims = [i for i, pl in enumerate(p.placements) if isinstance(pl, Shard)]
    if len(dims) != 1:
        raise FallbackRequired(f"a 4-bit weight placed {p.placements}: one sharded mesh dimension is expected")
    group = p.device_mesh.get_group(dims[0])
    n, rows = p.device_mesh.size(dims[0]), p.shape[0]
    chunk = math.ceil(rows / n)
    ranges = [(min(r * chunk, rows), min((r + 1) * chunk, rows)) for r in range(n)]
    return ranges, group, dist.get_rank(group)


def quantize_shard(p, info: Packed, ckpt: Checkpoint, key: str, from_dtype, device, keep_device):
    """(this rank's packed elements on keep_device, the absmax of all blocks on device): quantized on `device`
    from the values in `from_dtype`, as from_pretrained quantizes. A collective over the shard group: every rank
    of it calls this for the same parameter, in the same order."""
    import bitsandbytes  # noqa: F401 - registers torch.ops.bitsandbytes

    in_f, numel, bs = info.shape[1], info.shape[0] * info.shape[1], info.blocksize
    k = 2 * torch.empty((), dtype=info.storage).element_size()  # 4-bit values per storage element
    if bs % k:
        raise FallbackRequired(f"blocksize {bs} is not a multiple of the {k} values a {info.storage} element packs")
    nblocks = math.ceil(numel / bs)
    ranges, group, me = shard_ranges(p)

    def blocks(e0: int, e1: int) -> tuple[int, int]:
        return (e0 * k) // bs, min(math.ceil(e1 * k / bs), nblocks)

    e0, e1 = ranges[me]
    local = torch.empty((e1 - e0, 1), dtype=info.storage, device=keep_device)
    absmax = torch.empty(0, dtype=torch.float32, device=device)
    if e1 > e0:
        b0, b1 = blocks(e0, e1)
        v0, v1 = b0 * bs, min(b1 * bs, numel)
        r0, r1 = v0 // in_f, math.ceil(v1 / in_f)
        values = ckpt.rows(key, r0, r1).to(device=device, dtype=from_dtype).reshape(-1)
        values = values[v0 - r0 * in_f : v1 - r0 * in_f]
        packed, absmax = torch.ops.bitsandbytes.quantize_4bit.default(values, bs, info.quant_type, info.storage)
        del values
        first = (e0 * k - v0) // k
        local.copy_(packed[first : first + (e1 - e0)])
        del packed
    return local, _gather_absmax(absmax, [blocks(a, b) if b > a else (0, 0) for a, b in ranges], nblocks, group)


def _gather_absmax(mine, spans: list[tuple[int, int]], nblocks: int, group):
    """Every rank's absmax piece (blocks spans[r]) into the whole vector; a block two ranks share is computed
    identically by both."""
    import torch.distributed as dist

    width = max(b - a for a, b in spans)
    send = torch.zeros(width, dtype=torch.float32, device=mine.device)
    send[: mine.numel()] = mine
    recv = torch.empty(len(spans) * width, dtype=torch.float32, device=mine.device)
    dist.all_gather_into_tensor(recv, send, group=group)
    full = torch.empty(nblocks, dtype=torch.float32, device=mine.device)
    for r, (a, b) in enumerate(spans):
        full[a:b] = recv[r * width : r * width + (b - a)]
    return full


def quant_state(absmax, info: Packed, from_dtype):
    """The QuantState bnb.functional.quantize_4bit builds from the absmax of the whole weight."""
    from bitsandbytes.functional import QuantState, get_4bit_type, quantize_blockwise

    common = dict(shape=torch.Size(info.shape), dtype=from_dtype, blocksize=info.blocksize, quant_type=info.quant_type)
    code = get_4bit_type(info.quant_type, device=absmax.device)
    if info.nested:
        offset = absmax.mean()
        qabsmax, state2 = quantize_blockwise(absmax - offset, blocksize=256)
        return QuantState(absmax=qabsmax, code=code, offset=offset, state2=state2, **common)
    return QuantState(absmax=absmax, code=code, **common)
