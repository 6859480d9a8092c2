"""The check before each checkpoint of a model sharded at load (worker/saving/replicated.py): rank 0 writes the
adapter and the optimizer state for every rank, so every rank's must equal rank 0's. Two ranks stood in for by
all_gather (the dist test, tests/dist/test_expert_parallel.py, runs the check on two real ranks where it passes)."""

from __future__ import annotations

import pytest
import torch

from fsdp_tune.worker.saving import replicated


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    model[0].requires_grad_(False)  # frozen: not in the checkpoint's state
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def _two_ranks(monkeypatch, other) -> None:
    monkeypatch.setattr(replicated.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(replicated.dist, "get_world_size", lambda: 2)

    def all_gather(out, mine):
        out[0].copy_(mine)
        out[1].copy_(other(mine.clone()))

    monkeypatch.setattr(replicated.dist, "all_gather", all_gather)


def test_the_trainable_parameters_and_their_optimizer_state() -> None:
    model, optimizer = _trained()
    names = [name for name, _ in replicated.replicated_state(model, optimizer)]
    assert names[0] == "1.weight" and "1.weight (exp_avg)" in names and "1.bias (exp_avg_sq)" in names
    assert not any(n.startswith("0.") for n in names)


def test_equal_ranks_pass_and_a_diverged_rank_is_named(monkeypatch) -> None:
    model, optimizer = _trained()
    _two_ranks(monkeypatch, lambda t: t)
    replicated.check_same_on_ranks(model, optimizer, "cpu")

    def moved(t):  # rank 1's exp_avg of the second weight differs
        t[1, 0] += 1e-12 if t[1, 0] != 0 else 1.0
        return t

    _two_ranks(monkeypatch, moved)
    with pytest.raises(RuntimeError, match=r"rank 1's 1.weight \(exp_avg\) differs from rank 0's"):
        replicated.check_same_on_ranks(model, optimizer, "cpu")
