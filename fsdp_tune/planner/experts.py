"""Expert parallelism's share of a step (transformers' DistributedConfig ep_size, AllToAllEP in training): how many
of a layer's experts each rank holds, and the bytes its all-to-alls move. Pure arithmetic on the model's shape.

Each rank's tokens go to their top_k experts: AllToAllEP sends every (token, expert) pair's hidden state to the
rank that holds the expert (transformers/distributed/expert_parallel.py `_dispatch_tokens`) and brings the expert's
output back (`_combine_tokens`); the backward runs both exchanges again with the gradients. Under uniform routing
(ep - 1) / ep of the pairs leave the rank. Every decoder layer is taken to be a MoE layer (Mixtral, Qwen3-MoE's
default decoder_sparse_step 1); a model with dense layers between (mlp_only_layers) moves less.
"""

from __future__ import annotations

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import expert_parallel_size
from fsdp_tune.decide.method import steps
from fsdp_tune.planner.shape import ModelShape


def expert_parallel(cfg: RunConfig, shape: ModelShape, compute_bytes: int) -> dict | None:
    """None without expert parallelism (or without experts)."""
    ep = expert_parallel_size(cfg)
    if ep == 1 or not shape.n_experts:
        return None
    batch = steps(cfg)  # the typed batch, the method config's defaults filled in (decide/method.py)
    tokens = batch.per_device_train_batch_size * cfg.data.max_seq_len * batch.gradient_accumulation_steps  # a step
    pairs_sent = tokens * shape.top_k * (ep - 1) / ep
    per_layer = 4 * pairs_sent * shape.hidden_size * compute_bytes  # dispatch + combine, forward and backward
    world = max(cfg.launch.num_processes, 1)
    return {
        "ep_size": ep,
        "experts_per_rank": shape.n_experts // ep,
        "n_experts": shape.n_experts,
        "expert_copies": max(world // ep, 1),  # efsdp: the ranks holding the same experts, FSDP-sharded between them
        "all_to_all_gb_per_step_per_gpu": shape.n_layers * per_layer / 1e9,
    }


def describe(ep: dict) -> str:
    """The plan's line."""
    return (
        f"expert parallelism: ep {ep['ep_size']}: each rank holds {ep['experts_per_rank']} of every layer's "
        f"{ep['n_experts']} experts ({ep['expert_copies']} rank(s) share each, FSDP-sharded); all-to-all "
        f"{ep['all_to_all_gb_per_step_per_gpu']:.3f} GB per step per rank (uniform routing assumed)"
    )
