"""Context parallelism's attention on CPU (fsdp_tune/worker/cpu_cp.py), in one process: a cp mesh of one rank
takes the same dispatch path as the ranks' (SDPA's CPU kernel on sequence-sharded DTensors, torch's ring with its
log-sum-exp merge); two ranks, and the losses against one process, are tests/dist/test_train_variants.py's."""

from __future__ import annotations

import pytest


@pytest.fixture
def cp_mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("cp",))
    finally:
        dist.destroy_process_group()


def _attention_in_context(mesh, q, k, v):
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel

    q, k, v = (t.detach().clone() for t in (q, k, v))
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]  # this rank's shards (all of them: one rank)
        out = F.scaled_dot_product_attention(*leaves, is_causal=True)
        out.sum().backward()
    return out.detach(), [t.grad for t in leaves]


def test_sdpa_cpu_kernel_runs_torch_ring_attention_under_context_parallelism(cp_mesh) -> None:
    """Without the handler torch 2.13 refuses SDPA's CPU kernel under CP; with it, forward and backward match plain
    SDPA (fp32: the ring merges in fp32, 1e-6)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental._context_parallel import _attention

    from fsdp_tune.worker import cpu_cp

    aten = torch.ops.aten
    ours = (
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    )
    for op in ours:
        _attention.custom_ops.pop(op, None)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    with pytest.raises(Exception, match="_scaled_dot_product_flash_attention_for_cpu"):
        _attention_in_context(cp_mesh, q, k, v)

    assert cpu_cp.install() and cpu_cp.install()  # once, and again harmlessly
    assert all(_attention.custom_ops[op] is cpu_cp.handler for op in ours)
    out, grads = _attention_in_context(cp_mesh, q, k, v)
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*refs, is_causal=True)
    expected.sum().backward()
    torch.testing.assert_close(out, expected.detach(), rtol=1e-6, atol=1e-6)
    for got, ref in zip(grads, refs, strict=True):
        torch.testing.assert_close(got, ref.grad, rtol=1e-6, atol=1e-6)


def test_cpu_cp_refuses_what_the_ring_cannot_merge() -> None:
    from fsdp_tune.worker import cpu_cp

    with pytest.raises(NotImplementedError, match="attn_mask"):
        cpu_cp.ring_forward(None, None, None, None, attn_mask=object())
    with pytest.raises(NotImplementedError, match="dropout"):
        cpu_cp.ring_forward(None, None, None, None, dropout_p=0.1)
    assert cpu_cp.is_supported("2.13.0+cpu") and not cpu_cp.is_supported("2.14.0")


def test_evaluation_under_context_parallelism_is_transformers_prediction_step(monkeypatch) -> None:
    """TRL's SFTTrainer.prediction_step runs the forward outside CP's context (every rank the whole sequence); under
    CP fsdp-tune's trainer takes transformers' own, which counts the tokens first and evaluates inside the context
    (its eval_loss against one process's: tests/dist/test_train_variants.py)."""
    from types import SimpleNamespace

    import transformers

    from fsdp_tune.worker.training.trainer import FsdpSaving

    class MethodTrainer:  # stands for TRL's trainer class, which FsdpSaving is mixed into
        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            return "trl"

    class Mixed(FsdpSaving, MethodTrainer):
        pass

    monkeypatch.setattr(transformers.Trainer, "prediction_step", lambda self, *a, **k: "transformers")
    trainer = Mixed.__new__(Mixed)
    trainer.accelerator = SimpleNamespace(parallelism_config=SimpleNamespace(cp_enabled=True))
    assert trainer.prediction_step(None, {}, True) == "transformers"
    trainer.accelerator.parallelism_config.cp_enabled = False
    assert trainer.prediction_step(None, {}, True) == "trl"
    trainer.accelerator.parallelism_config = None
    assert trainer.prediction_step(None, {}, True) == "trl"
