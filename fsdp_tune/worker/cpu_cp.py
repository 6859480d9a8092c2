"""Context parallelism on CPU ranks: torch's own ring attention reached from SDPA's CPU kernel.

Under context parallelism (accelerate's `maybe_context_parallel`, torch's `context_parallel`) every call of
`F.scaled_dot_product_attention` gets its query, key and value as DTensors sharded along the sequence
(`Shard(2)` on the cp mesh), and DTensor's dispatcher hands the attention kernel the SDPA picked to a handler of
torch's `_context_parallel/_attention.py`: its `custom_ops` table maps the CUDA kernels (flash, efficient,
cuDNN, forward and backward) to `_templated_ring_attention` and `_templated_ring_attention_backward`. On CPU
SDPA picks `aten._scaled_dot_product_flash_attention_for_cpu`, which is not in that table and has no sharding
strategy, so torch 2.13 fails at the first attention call ("... does not have a sharding strategy registered").

This module adds the CPU kernel (forward and backward) to that table, calling the same templated ring
functions with the CPU kernel as the op: the ring (its rotation of key and value, all-gather or all-to-all),
the log-sum-exp merge and the head-tail load balancing are torch's, unchanged; only the per-block kernel is
the CPU one. The CPU kernel returns (out, logsumexp) forward and (grad_q, grad_k, grad_v) backward, the shape the
templated functions expect (they unpack `out, lse, *rest` and `dq, dk, dv, *rest`). Outputs keep the
inputs' placement, `Shard(2)` on the cp mesh, as torch's CP sharding rules give the CUDA kernels.

Installed only for CPU runs with cp_size above 1 (worker/process.py, from the rank spec's `cpu_fsdp_shim`,
decide/derived.py's `runs_on_cpu`), and only once; on GPUs the CUDA kernels are torch's own entries and this
module is never imported.
"""

from __future__ import annotations

from typing import Any

# Checked against torch 2.13 (the templated ring functions' signatures and the custom_ops table).
SUPPORTED = ((2, 13), (2, 13))

SEQ_DIM = 2  # torch's CP shards SDPA's (batch, heads, sequence, head_dim) along dim 2 (its handlers hardcode it)


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def is_supported(version: str) -> bool:
    low, high = SUPPORTED
    return low <= _version_tuple(version) <= high


def _plain_attention(attn_mask: Any, dropout_p: float) -> None:
    """The ring merges blocks by their log-sum-exp: an explicit mask or dropout would need the block's slice of them
    (accelerate drops the mask and sets is_causal; fsdp-tune's CP runs have no attention dropout)."""
    if attn_mask is not None:
        raise NotImplementedError("context parallelism on CPU: SDPA with an explicit attn_mask is not supported")
    if dropout_p:
        raise NotImplementedError(f"context parallelism on CPU: attention dropout {dropout_p} is not supported")


def ring_forward(mesh, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """`_scaled_dot_product_flash_attention_for_cpu` over the cp ring: (out, logsumexp), each this rank's shard."""
    import torch
    from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention

    _plain_attention(attn_mask, dropout_p)
    return _templated_ring_attention(
        mesh.get_group(),
        SEQ_DIM,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
        query=query,
        key=key,
        value=value,
        is_causal=is_causal,
        dropout_p=dropout_p,
        scale=scale,
    )


def ring_backward(
    mesh, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    """`_scaled_dot_product_flash_attention_for_cpu_backward` over the cp ring: (grad_q, grad_k, grad_v)."""
    import torch
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _templated_ring_attention_backward,
    )

    _plain_attention(attn_mask, dropout_p)
    return _templated_ring_attention_backward(
        mesh.get_group(),
        SEQ_DIM,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        grad_out=grad_out,
        grad_out_name="grad_out",
        query=query,
        key=key,
        value=value,
        out=out,
        logsumexp=logsumexp,
        is_causal=is_causal,
        dropout_p=dropout_p,
        scale=scale,
    )


def handler(op_call, args: tuple, kwargs: dict) -> object:
    """DTensor's custom handler for the CPU kernel: every tensor argument this rank's sequence shard on a 1-D cp
    mesh (what torch's `sdpa_input_fn` makes); the ring's results wrapped with the same placement."""
    import torch
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._utils import compute_global_tensor_info

    dispatcher = DTensor._op_dispatcher
    info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    mesh = info.compute_mesh
    placements = (Shard(SEQ_DIM),)
    for spec in info.schema.args_spec:
        if spec.mesh.ndim != 1 or tuple(spec.placements) != placements:
            raise NotImplementedError(
                f"context parallelism on CPU: {op_call} needs every input sharded along the sequence on the cp mesh, "
                f"got {spec.placements} on a {spec.mesh.ndim}-D mesh"
            )
    ring = (
        ring_forward if op_call == torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default else ring_backward
    )
    results = ring(mesh, *info.local_args, **info.local_kwargs)
    specs = []
    for local in results:
        shape, stride = compute_global_tensor_info(local, mesh, placements)
        meta = TensorMeta(torch.Size(shape), tuple(stride), local.dtype)
        specs.append(DTensorSpec(mesh, placements, tensor_meta=meta))
    return dispatcher.wrap(tuple(results), tuple(specs))


def install() -> bool:
    """Add the CPU kernel and its backward to torch's CP handler table (read each time CP is entered). Returns
    True once active."""
    import torch
    from torch.distributed.tensor.experimental._context_parallel import _attention

    if not is_supported(torch.__version__):
        raise RuntimeError(
            f"fsdp-tune's CPU context-parallel handler was checked against torch {SUPPORTED[0]}..{SUPPORTED[1]}, "
            f"found {torch.__version__}; install the version in constraints.txt to run context parallelism on CPU"
        )
    table = getattr(_attention, "custom_ops", None)
    if not isinstance(table, dict) or not hasattr(_attention, "_templated_ring_attention_backward"):
        raise RuntimeError(
            f"torch {torch.__version__}: context parallelism no longer keeps its handlers in _attention.custom_ops; "
            "fsdp-tune's CPU context-parallel handler needs updating (install the torch version in constraints.txt)"
        )
    aten = torch.ops.aten
    table[aten._scaled_dot_product_flash_attention_for_cpu.default] = handler
    table[aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = handler
    return True
