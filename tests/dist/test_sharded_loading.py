"""Sharded loading trains exactly as from_pretrained does: the same losses and the same saved adapter, bit for bit,
for LoRA, nested-4-bit QLoRA, a vocabulary grown for new chat tokens under FSDP activation checkpointing and bf16,
and the 125M built-in model; and a model only the ranks can tell sharded loading cannot take (its checkpoint lacks
a tensor the model has) falls back on every rank and trains as the transformers path does. Every pair runs in the
session's `variants` launch (tests/dist/conftest.py loading_runs): the rank specs come from the launcher's own
plan_run, one per path (--loading transformers | auto, which the launcher resolves to sharded)."""

from __future__ import annotations

import json

from tests.dist.conftest import FALLBACK, LOADING_PATHS, SHARDED_CASES, Member
from tests.dist.conftest import loading_name as _name

PATHS = LOADING_PATHS


def test_sharded_loading_trains_as_from_pretrained_does(variants) -> None:
    group, cases = variants, [*SHARDED_CASES, FALLBACK]
    for case in cases:
        members = {path: group[_name(case, path)] for path in PATHS}
        assert [members[path].spec.loading.path for path in PATHS] == list(PATHS), case  # as planned
        _assert_same_training(case, members)
    fallback = group[_name(FALLBACK, "sharded")].summary["extra"]["loading"]
    assert fallback["path"] == "transformers" and "lm_head.weight" in fallback["note"], fallback
    grown = group[_name("grown vocabulary, FSDP AC, bf16", "sharded")].summary
    assert grown["vocab_grew"]["rows"] > grown["vocab_grew"]["from"]
    qlora = group[_name("qlora", "sharded")].summary
    assert qlora["extra"]["loading"]["tensors_quantized"] == 28  # 7 linears x 4 layers, each rank its part


def _assert_same_training(case: str, members: dict[str, Member]) -> None:
    from safetensors.torch import load_file

    summary = {p: members[p].summary for p in PATHS}
    runs = {p: members[p].output_dir for p in PATHS}
    took = [summary[p]["extra"]["loading"]["path"] for p in PATHS]
    assert took == (["transformers"] * 2 if case == FALLBACK else list(PATHS)), case
    assert summary["sharded"]["losses"] == summary["transformers"]["losses"], case
    assert summary["sharded"]["vocab_grew"] == summary["transformers"]["vocab_grew"], case
    assert all(summary[p]["adapter_check"]["ok"] for p in PATHS), case
    adapters = {p: load_file(str(runs[p] / "adapter_model.safetensors")) for p in PATHS}
    assert adapters["sharded"].keys() == adapters["transformers"].keys(), case
    for name, tensor in adapters["sharded"].items():
        assert tensor.equal(adapters["transformers"][name]), (case, name)
    configs = {p: json.loads((runs[p] / "adapter_config.json").read_text()) for p in PATHS}
    for config in configs.values():
        config["target_modules"] = sorted(config["target_modules"])  # a set: its order is the process's
    assert configs["sharded"] == configs["transformers"], case
