"""One optimizer step as TRL's trainer of the run's method runs it on a rank (transformers 5.24
Trainer.training_step; TRL 1.16 SFTTrainer.compute_loss, DPOTrainer._compute_loss, KTOTrainer._compute_loss), and
what it executed: FLOPs (the formulas of torch's FlopCounterMode, per op) and the bytes
each collective moved.

The batch is `per_device_train_batch_size` sequences of `max_seq_len` tokens, every one full length (no padding:
transformers then drops the attention mask for SDPA, as it does for an all-ones mask), every label trained."""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fsdp_tune.config.methods import row_of

REFERENCE = "reference forward (no grad)"  # planner/method.py REFERENCE_PHASE: the same phase, by name


def fused_head(model, method: str = "sft") -> None:
    """The trainer's __init__: add_fused_lm_head on the base model (after FSDP wrapped it, on the sharded path)."""
    from trl.trainer.utils import add_fused_lm_head

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    add_fused_lm_head(base, outputs=row_of(method).fused_head)  # what the method's trainer asks of it


def optimizer(model, optim: str):
    """The Trainer's optimizer for TRL's default `adamw_torch_fused` (fused AdamW), or `adamw_torch` (foreach)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if optim == "adamw_torch":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    return torch.optim.AdamW(params, lr=1e-4, fused=True)


def batch(vocab: int, micro_batch: int, seq_len: int) -> dict:
    """TRL's collator's batch of full-length rows: token ids, labels, an all-ones attention mask."""
    input_ids = torch.randint(0, vocab, (micro_batch, seq_len))
    return {"input_ids": input_ids, "labels": input_ids.clone(), "attention_mask": torch.ones_like(input_ids)}


def train_step(
    model,
    opt,
    inputs: dict,
    micro_batches: int,
    precision: str,
    max_grad_norm: float,
    phase=None,
    method="sft",
    shard=None,
):
    """Forward (TRL's fused head, under the mixed-precision autocast accelerate wraps the forward in), backward,
    for each micro-batch; then gradient clipping, AdamW, zero_grad(set_to_none). DPO and KTO add their no-grad
    forwards where their trainers run them: DPO's reference after the policy's forward (on its chosen and rejected
    rows, `inputs` holding both), KTO's KL forward of the policy before it and the reference's KL and main
    forwards after it, while the policy's activations wait for the backward. `phase(name, new_micro_batch)` marks
    where the step is for the tracker. `shard` (context parallelism, trace/context.py): each micro-batch a new
    batch, sharded along the sequence as the Trainer shards it, its forward and backward inside torch's
    context_parallel (Trainer.training_step)."""
    mark = phase or (lambda name, new_micro_batch=True: None)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
    for _ in range(micro_batches):
        mark("forward")
        cp, micro = contextlib.nullcontext(), inputs
        if shard is not None:  # the Trainer's next batch, sharded in place
            cp, micro = shard({k: v.clone() for k, v in inputs.items()})
        with cp:
            _micro_batch(model, micro, autocast, mark, method, micro_batches)
    params = [p for p in model.parameters() if p.requires_grad]
    mark("gradient clipping")
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    mark("optimizer step")
    opt.step()
    model.zero_grad(set_to_none=True)


def _micro_batch(model, inputs: dict, autocast, mark, method: str, micro_batches: int) -> None:
    """One micro-batch's forwards, loss and backward (train_step)."""
    step = row_of(method).step  # KTO's KL forward comes before the policy's, the references after it
    before, after = step.no_grad_before, step.no_grad_after
    _no_grad_forwards(model, inputs, autocast, before, mark, policy=True)
    if before:
        mark("forward")  # the policy's forward: what its backward reads is counted from here
    with autocast:
        out = model(**inputs, fused_lm_head=True, use_cache=False)
    if step.loss_over == "tokens":
        loss = -out.log_probs.float().sum() / out.label_mask.sum().clamp(min=1)
    else:  # the preference losses are functions of each sequence's summed log-probabilities
        loss = -torch.nn.functional.logsigmoid(0.1 * out.log_probs.float().sum(-1)).mean()
    del out
    if after:
        _no_grad_forwards(model, inputs, autocast, after, mark, policy=False)
        mark("forward", False)  # back to the layers' phases for the backward
    (loss / micro_batches).backward()
    del loss


def _no_grad_forwards(model, inputs: dict, autocast, n: int, mark, policy: bool) -> None:
    """`n` forwards without gradients (TRL: torch.no_grad(); the reference with the policy's adapter off: a fresh
    adapter is the base, and on the sharded path fsdp-tune's frozen "ref" adapter of the same shape stands in)."""
    if not n:
        return
    mark(REFERENCE, False)
    adapters_off = contextlib.nullcontext() if policy else model.disable_adapter()
    with torch.no_grad(), autocast, adapters_off:
        for _ in range(n):
            out = model(**inputs, fused_lm_head=True, use_cache=False)
            out.log_probs.float().sum(-1)
            del out


class Executed(TorchDispatchMode):
    """What the step executed: FLOPs by torch's own per-op formulas (torch.utils.flop_counter's registry: matmuls,
    attention; FlopCounterMode itself holds on to the recomputed activations through its module hooks), and the bytes
    each collective moved, by kind: all-gather outputs, reduce-scatter inputs, all-reduce buffers, with the group size
    (a rank receives (n-1)/n of an all-gather's output); the context-parallel ring's (its K/V all-gathered, its K/V
    and dK/dV sent all-to-all) apart: those made while `in_ring()` says the step is inside it. Local ops only: DTensor
    ops desugar first."""

    KINDS = {"allgather": "all-gather", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter"}
    RING = "context-parallel ring"

    def __init__(self, in_ring=lambda: False) -> None:
        from torch.utils.flop_counter import flop_registry

        super().__init__()
        self.in_ring = in_ring
        self.registry = flop_registry
        self.flops = 0
        self.bytes: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):
            return NotImplemented
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.flops += _flops(self.registry, func, args, kwargs, out)
        if getattr(func, "namespace", "") in ("c10d", "_c10d_functional"):
            self._count(func._opname, args, out)
        return out

    def _count(self, name: str, args, out) -> None:
        """c10d's in-place ops (FSDP) and the functional ones (DTensor's full_tensor, clipping's norm, the ring's)."""
        if name.startswith("all_to_all_single"):  # functional (input, output_splits, input_splits, group_name)
            if self.in_ring():  # torch's permute_tensor: what this rank (rank 0 of the ring) sends
                sent = sum(args[2]) - args[2][0] if args[2] else args[0].numel() * (1 - 1 / max(len(args[1]), 1))
                self.bytes[self.RING] += sent * args[0].element_size()
            return
        kind = next((v for k, v in self.KINDS.items() if k in name), "all-reduce" if "reduce" in name else None)
        if kind is None:
            return
        ring = self.in_ring()  # the ring's K/V all-gathered (cp_comm_strategy allgather)
        if name.startswith("_allgather_base"):  # (output, input, group, ...): the group's size is their ratio
            tensor, size = args[0], args[0].numel() // max(args[1].numel(), 1)
        elif name.startswith("_reduce_scatter_base"):  # (output, input, ...)
            tensor, size = args[1], args[1].numel() // max(args[0].numel(), 1)
        elif kind == "all-gather":  # functional (input, group_size, group_name)
            tensor, size = out, int(args[1])
        elif kind == "reduce-scatter":  # functional (input, reduce_op, group_size, group_name)
            tensor, size = args[0], int(args[2])
        else:  # all-reduce: a ring moves twice the buffer
            tensor = args[0][0] if isinstance(args[0], (list, tuple)) else args[0]
            self.bytes[kind] += 2 * tensor.numel() * tensor.element_size()
            return
        self.bytes[self.RING if ring else kind] += tensor.numel() * tensor.element_size() * (size - 1) / max(size, 1)


def _flops(registry, func, args, kwargs, out) -> int:
    """torch's formula for the op; and the ops it has none for that the trace runs: bitsandbytes' 4-bit matmul
    (seen before its stand-in), a linear that reaches dispatch whole, the experts' grouped matmul, SDPA's CPU flash
    kernel (counted as torch counts the CUDA ones: the full s x s scores, causal or not)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    name = getattr(func, "_opname", "")
    if name == "addmm" and "out_dtype" in str(func._schema):  # TRL's fp32 accumulation (its out_dtype is positional)
        return 2 * out.numel() * args[1].shape[-1]
    formula = registry.get(func._overloadpacket)
    if formula is not None:
        return formula(*args, **kwargs, out_val=out)
    if name in ("gemm_4bit", "linear"):  # [.., K] x [N, K]: 2 M N K
        return 2 * out.numel() * args[0].shape[-1]
    if "grouped_mm" in name:  # MoE experts: [S, K] x [E, K, N] -> [S, N]; the weight's grad [E, K, N] sums S rows
        return 2 * out.numel() * args[0].shape[-1] // (out.shape[0] if out.dim() == 3 else 1)
    if name == "_scaled_dot_product_flash_attention_for_cpu":
        return sdpa_flop_count(*(t.shape for t in args[:3]))
    if name == "_scaled_dot_product_flash_attention_for_cpu_backward":
        return sdpa_backward_flop_count(*(t.shape for t in args[:4]))
    return 0
