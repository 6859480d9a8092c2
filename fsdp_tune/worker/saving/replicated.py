"""Checkpoints of a model transformers sharded at load (DistributedConfig: expert parallelism), where only the
adapter trains. transformers 5.24's Trainer refuses to checkpoint such a model at all (trainer.py:633: its optimizer
state could hold DTensor shards the Trainer cannot save); under fsdp-tune's rules only LoRA on attention and the
dense layers trains there (FT140, FT141), and those parameters are plain tensors replicated on every rank, their
gradients averaged by the Trainer (_sync_replicated_trainable_parameters), so the optimizer's state is replicated
too. Rank 0's adapter, optimizer and scheduler files are then the whole state: checked here before each save
(every trainable parameter a plain tensor, the same on every rank), then written and read back by the Trainer's
own non-FSDP paths (worker/training/trainer.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def replicated_state(model, optimizer) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every trainable parameter and of its optimizer state, in one order on every rank;
    refuses a trainable DTensor (a sharded parameter's state would not be rank 0's alone)."""
    from torch.distributed.tensor import DTensor

    out = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if isinstance(param, DTensor):
            raise RuntimeError(
                f"{name} is a sharded trainable parameter (DTensor) of a model sharded at load: its checkpoint "
                "would hold rank 0's shard only. Train LoRA on attention and the dense layers only (FT140)"
            )
        out.append((name, param.detach()))
        state = optimizer.state.get(param, {}) if optimizer is not None else {}
        out += [(f"{name} ({key})", v.detach()) for key, v in sorted(state.items()) if torch.is_tensor(v)]
    return out


def check_same_on_ranks(model, optimizer, device: str) -> None:
    """Every rank's adapter and optimizer state equal rank 0's (a sum and a sum of squares per tensor, in float64,
    compared exactly): the checkpoint rank 0 writes is every rank's. A collective on all ranks."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    tensors = replicated_state(model, optimizer)
    if not tensors:
        return
    mine = torch.stack([torch.stack([t.double().sum(), t.double().square().sum()]) for _, t in tensors]).to(device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    for rank, theirs in enumerate(every[1:], 1):
        differs = [name for (name, _), a, b in zip(tensors, every[0], theirs, strict=True) if not torch.equal(a, b)]
        if differs:
            raise RuntimeError(
                f"rank {rank}'s {differs[0]} differs from rank 0's ({len(differs)} tensor(s)): the replicated "
                "adapter diverged across ranks, so rank 0's checkpoint is not every rank's"
            )
