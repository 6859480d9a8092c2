"""Context parallelism in the trace: the step runs each micro-batch inside torch's `context_parallel`, as a rank does.

What a GPU rank runs under `cp_size` > 1, and what the trace runs of it:
- accelerate's `_prepare_cp`: the K/V rotation (`set_rotate_method`, the run's `cp_comm_strategy`) and the hooks on
  every `self_attn` that drop the attention mask and pass `is_causal=True` (big_modeling.py
  `_attach_context_parallel_hooks`): called as they are.
- transformers' `Trainer._prepare_context_parallel_inputs` (shift_labels, position_ids, the buffers to shard) and
  accelerate's `maybe_context_parallel`, torch's `context_parallel` on the mesh's `cp` dimension: called as they
  are, on a stand-in Trainer and Accelerator that hold only the ParallelismConfig and its device mesh. torch's
  head-tail load balancer reorders every buffer and each rank keeps its 1/cp of the sequence (two chunks).
- SDPA patched to wrap query, key and value as DTensors sharded along the sequence; DTensor's dispatcher hands the
  attention kernel to torch's `_templated_ring_attention` (forward) and `_templated_ring_attention_backward`: the
  K/V all-gathered (or rotated all-to-all), the fp32 output merger, fp32 dq/dk/dv, the fp32 dK/dV rotated back.
  On a `cpu` fake device SDPA's kernel is `_scaled_dot_product_flash_attention_for_cpu`, for which torch 2.13 has no
  CP handler (`_attention.py` `custom_ops` lists the CUDA kernels only); worker/cpu_cp.py's handler, the one CPU
  ranks train with, calls the same templated ring functions with the CPU kernel, and is installed for the trace
  only (the table is restored after). Each block's kernel is flash-style: it returns the block's output and fp32
  log-sum-exp, never the S x S scores, as the CUDA flash kernel it stands for.

The trace is rank 0 of the fake process group, so rank 0 of the cp ring: its causal blocks (torch's
`_is_causal_behavior`) are every other rank's, by the head-tail balancing, and its buffers are the same size."""

from __future__ import annotations

import contextlib
import types

SEQ_BUFFERS = ("input_ids", "labels", "shift_labels", "attention_mask", "position_ids")  # what the Trainer shards


def cp_size(spec) -> int:
    """The ranks one sequence is split over (1 without context parallelism)."""
    return spec.parallelism.cp_size if spec.parallelism is not None else 1


@contextlib.contextmanager
def ring(strategy: str):
    """torch's ring attention reachable from SDPA's CPU kernel (worker/cpu_cp.py's handler), with the run's K/V
    rotation; torch's handler table and rotation restored after."""
    import torch
    from torch.distributed.tensor.experimental._context_parallel import _attention

    from fsdp_tune.worker import cpu_cp

    table = dict(_attention.custom_ops)
    rotation = _attention._cp_options.rotate_method
    cpu_cp.install()
    for op in CPU_KERNELS:
        key = getattr(torch.ops.aten, op).default
        _attention.custom_ops[key] = _marked(_attention.custom_ops[key])
    _attention.set_rotate_method(strategy)
    try:
        yield
    finally:
        _attention.custom_ops.clear()
        _attention.custom_ops.update(table)
        _attention._cp_options.rotate_method = rotation


CPU_KERNELS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward")
_inside = [0]  # ring attention calls under way


def in_ring() -> bool:
    """The step is inside torch's ring attention: the collectives now are the ring's (its K/V and dK/dV). Told
    apart by where they run, not by their group: with dp_shard 1 the FSDP mesh and the cp mesh are the same ranks."""
    return _inside[0] > 0


def _marked(handler):
    def inner(op_call, args, kwargs):
        _inside[0] += 1
        try:
            return handler(op_call, args, kwargs)
        finally:
            _inside[0] -= 1

    return inner


def attach_hooks(model) -> None:
    """accelerate's `_prepare_cp` on the model: each self_attn's mask dropped, `is_causal=True` passed."""
    from accelerate.big_modeling import _attach_context_parallel_hooks

    _attach_context_parallel_hooks(model)


def sharder(parallelism_config, model):
    """A function of one micro-batch that returns the context it runs in and the batch the model takes: transformers'
    `Trainer._prepare_context_parallel_inputs` and accelerate's `maybe_context_parallel`, on stand-ins that hold the
    run's ParallelismConfig and the device mesh FSDP was built on."""
    import functools

    from accelerate import Accelerator
    from torch.distributed.tensor.experimental import context_parallel
    from transformers import Trainer

    mesh = parallelism_config.get_device_mesh("cpu")
    accelerator = types.SimpleNamespace(
        parallelism_config=parallelism_config,
        _cp_context=functools.partial(context_parallel, mesh=mesh["cp"]),
    )
    accelerator.maybe_context_parallel = Accelerator.maybe_context_parallel.__get__(accelerator)
    trainer = types.SimpleNamespace(accelerator=accelerator)

    def shard(batch: dict):
        with _quiet("transformers.trainer"):  # "Shift labels not found ...": what the ranks log once, not the plan
            cp_context, batch = Trainer._prepare_context_parallel_inputs(trainer, model, batch)
        return cp_context(), batch

    return shard


@contextlib.contextmanager
def _quiet(name: str):
    import logging

    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
