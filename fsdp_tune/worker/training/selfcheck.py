"""The distributed self-check, for every method: after the first optimizer step (gradients still held), every rank's
trainable parameters are confirmed sharded or identical across ranks, and their gradients reduced. A divergence stops
the run at step 1 with one line naming the parameter, instead of training ranks that silently drifted apart.

    sharded   a DTensor sharded over FSDP's mesh (a dimension of more than one rank): each rank owns its rows, the
              ranks' rows add up to the whole tensor, and its gradient is a DTensor placed as it is (FSDP's
              reduce-scatter made it)
    whole     a plain tensor, or a DTensor replicated over a mesh dimension (HSDP's replicas): its value and its
              gradient must be the same on every rank holding a copy (a gradient that differs was never reduced:
              a trainable parameter FSDP does not manage, such as an adapter added after sharding)
    experts   under expert parallelism (transformers' DistributedConfig(ep_size)), every parameter, frozen ones too,
              split over the mesh dimension named "ep": each expert-parallel rank must hold experts of its own, so
              the ranks' local slices must differ (a copy of rank 0's experts on every rank, transformers#45662, is
              a model that routes tokens to experts it does not have)

Cheap: one all-reduce of a structure hash (every rank has the same trainable parameters, shapes, dtypes and
placements), one of the sharded row counts, one of three float64 checksums (sum, sum of squares, a position-weighted
sum) of each whole parameter and its gradient, over the ranks that hold it. FSDP1's flat parameters are views a rank
may hold empty (not checked: the plan says so).
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from fsdp_tune.worker.wrappers import canonical_name


class SelfCheckFailed(RuntimeError):
    pass


class DistributedSelfCheck(TrainerCallback):
    def __init__(self, world_size: int, fsdp_version: int, device: str):
        self.active = world_size > 1 and fsdp_version == 2
        self.device = device
        self.result: dict | None = None

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if not self.active or self.result is not None or model is None or not dist.is_initialized():
            return
        self.result = check(model, self.device)


def _placement(p) -> tuple[str, tuple[int, ...]]:
    """('sharded' | 'whole', the mesh dims a whole DTensor is replicated over)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return "whole", ()
    sizes = p.device_mesh.shape
    shard = [i for i, pl in enumerate(p.placements) if pl.is_shard() and sizes[i] > 1]
    replicated = tuple(i for i, pl in enumerate(p.placements) if pl.is_replicate() and sizes[i] > 1)
    return ("sharded" if shard else "whole"), replicated


def _describe(name: str, p) -> str:
    from torch.distributed.tensor import DTensor

    held = f"{tuple(p.device_mesh.shape)}:{p.placements}" if isinstance(p, DTensor) else "plain"
    return f"{name}|{tuple(p.shape)}|{p.dtype}|{held}"


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")


def _sums(t) -> list[float]:
    from torch.distributed.tensor import DTensor

    x = (t.to_local() if isinstance(t, DTensor) else t).detach().double().flatten()
    if x.numel() == 0:
        return [0.0, 0.0, 0.0]
    weights = torch.arange(1, x.numel() + 1, dtype=torch.float64, device=x.device) / x.numel()
    return [x.sum().item(), (x * x).sum().item(), (x * weights).sum().item()]


def _spread(values: list[float], device: str, group=None) -> tuple[list[float], list[float]]:
    """(max, min) of each value over the group's ranks, in one all-reduce."""
    t = torch.tensor(values + [-v for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    n = len(values)
    return t[:n].tolist(), [-v for v in t[n:].tolist()]


def check(model, device: str) -> dict:
    """long because it is the check's three steps in order: the structure, the shards, the whole tensors."""
    from torch.distributed.tensor import DTensor

    params = [(canonical_name(n), p) for n, p in model.named_parameters() if p.requires_grad]
    structure = "\n".join(_describe(n, p) for n, p in params)
    high, low = _spread([float(_hash(structure))], device)
    if high != low:
        raise SelfCheckFailed(
            "distributed self-check failed after step 1: the ranks hold different trainable parameters (names, "
            f"shapes, dtypes or placements; {len(params)} on this rank): a rank built or wrapped the model otherwise"
        )
    sharded = [(n, p) for n, p in params if _placement(p)[0] == "sharded"]
    whole = [(n, p) for n, p in params if _placement(p)[0] == "whole"]
    for name, p in sharded:
        g = p.grad
        if g is None or not isinstance(g, DTensor) or g.placements != p.placements:
            got = "no gradient" if g is None else f"a gradient placed {getattr(g, 'placements', 'as a plain tensor')}"
            raise SelfCheckFailed(
                f"distributed self-check failed after step 1: {name} is sharded {p.placements} but has {got}: FSDP "
                "did not reduce its gradient"
            )
    if sharded:
        rows = torch.tensor([p.to_local().numel() for _, p in sharded], dtype=torch.int64, device=device)
        dist.all_reduce(rows, op=dist.ReduceOp.SUM)
        for (name, p), held in zip(sharded, rows.tolist(), strict=True):
            copies = _copies(p)
            if held != p.numel() * copies:
                raise SelfCheckFailed(
                    f"distributed self-check failed after step 1: {name}'s shards hold {held} values over the ranks "
                    f"for a tensor of {p.numel()} (x{copies} replicas): the ranks do not split it"
                )
    _check_whole(whole, device)
    result = {"step": 1, "sharded": len(sharded), "whole": len(whole), "ok": True}
    experts = _check_experts(model, device)
    return {**result, "experts": experts} if experts else result


def _expert_split(p) -> bool:
    """A DTensor sharded over a mesh dimension named "ep" of more than one rank."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor) or "ep" not in (p.device_mesh.mesh_dim_names or ()):
        return False
    dim = p.device_mesh.mesh_dim_names.index("ep")
    return p.device_mesh.shape[dim] > 1 and p.placements[dim].is_shard()


def _check_experts(model, device: str) -> int:
    """Every expert-parallel parameter's local slice differs from the other expert-parallel ranks' (one
    all-reduce over the ep group); how many were checked."""
    split = [(canonical_name(n), p) for n, p in model.named_parameters() if _expert_split(p)]
    if not split:
        return 0
    mesh = split[0][1].device_mesh
    group = mesh.get_group(mesh.mesh_dim_names.index("ep"))
    high, low = _spread([v for _, p in split for v in _sums(p)], device, group)
    for i, (name, _) in enumerate(split):
        if high[3 * i : 3 * i + 3] == low[3 * i : 3 * i + 3]:
            raise SelfCheckFailed(
                f"distributed self-check failed after step 1: {name} is split over the expert-parallel ranks but "
                "every rank holds the same experts (a copy of one rank's, not its own share)"
            )
    return len(split)


def _copies(p) -> int:
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return dist.get_world_size()
    sizes = p.device_mesh.shape
    copies = 1
    for i, pl in enumerate(p.placements):
        if pl.is_replicate():
            copies *= sizes[i]
    return copies * (dist.get_world_size() // p.device_mesh.size())


def _check_whole(whole: list, device: str) -> None:
    """Each whole parameter and its gradient identical on every rank that holds a copy (plain tensors: all ranks;
    replicated DTensors: the ranks of each replicated mesh dimension)."""
    from torch.distributed.tensor import DTensor

    groups: dict[object, list] = {}
    for name, p in whole:
        _, replicated = _placement(p)
        keys = [(id(p.device_mesh), d) for d in replicated] if isinstance(p, DTensor) else [None]
        for key in keys:
            groups.setdefault(key, []).append((name, p))
    for key in sorted(groups, key=str):
        members = groups[key]
        group = None if key is None else _mesh_group(members[0][1], key[1])
        values = [v for _, p in members for v in _sums(p) + (_sums(p.grad) if p.grad is not None else [0.0] * 3)]
        high, low = _spread(values, device, group)
        for i, (name, _) in enumerate(members):
            part = slice(6 * i, 6 * i + 6)
            if high[part][3:] != low[part][3:]:
                raise SelfCheckFailed(
                    f"distributed self-check failed after step 1: {name} is a whole copy on each rank and its "
                    "gradient differs across them: it was never reduced (a trainable parameter FSDP does not manage)"
                )
            if high[part][:3] != low[part][:3]:
                raise SelfCheckFailed(
                    f"distributed self-check failed after step 1: {name} differs across the ranks that hold it "
                    f"(sum {low[part][0]:.6g} .. {high[part][0]:.6g}): its copies are not kept in sync"
                )


def _mesh_group(p, dim: int):
    return p.device_mesh.get_group(dim)
