"""Sharded loading trains exactly as from_pretrained does: the same losses and the same saved adapter, bit for bit,
for LoRA, nested-4-bit QLoRA, a vocabulary grown for new chat tokens under FSDP activation checkpointing and bf16,
and the 125M built-in model; and a model only the ranks can tell sharded loading cannot take (its checkpoint lacks
a tensor the model has) falls back on every rank and trains as the transformers path does. Every pair runs in one
torchrun launch (tests/dist/conftest.py launch_group): the rank specs come from the launcher's own plan_run, one
per path (--loading transformers | auto, which the launcher resolves to sharded)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import offline_env
from tests.dist.conftest import QLORA, Member, environment, launch_group

CASES = {
    "lora": (),
    "qlora": (*QLORA, "--use_nested_quant", "True"),
    "grown vocabulary, FSDP AC, bf16": ("--chat_template_format", "zephyr", "--fsdp_activation_checkpointing", "true")
    + ("--bf16", "True"),
    "small-llama": ("--model_name_or_path", "builtin:small-llama", "--max_seq_len", "64")
    + ("--per_device_train_batch_size", "2", "--max_steps", "2"),
}
PATHS = ("transformers", "sharded")
FALLBACK = "fallback on the ranks"


def _without_lm_head(folder: Path, copy: Path) -> str:
    """The tiny model with lm_head.weight missing from its checkpoint: from_pretrained initialises it (randomly,
    with a warning); sharded loading cannot, and only a rank reading the checkpoint finds out."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, copy)
    tensors = load_file(str(copy / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    return str(copy)


def test_sharded_loading_trains_as_from_pretrained_does(tmp_path, model_cache) -> None:
    from fsdp_tune.sources.builtin import materialize

    with environment(offline_env(model_cache)):  # where the ranks read the builtin models
        broken = _without_lm_head(materialize("tiny-llama"), tmp_path / "m")
    cases = {**CASES, FALLBACK: ("--model_name_or_path", broken)}
    runs = {
        (case, path): ("--max_steps", "3", *flags, "--loading", "auto" if path == "sharded" else path)
        for case, flags in cases.items()
        for path in PATHS
    }  # --loading auto: the default decides sharded loading
    named = {_name(*key): flags for key, flags in runs.items()}
    group = launch_group(tmp_path / "runs", model_cache, named, check=True)
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


def _name(case: str, path: str) -> str:
    return f"{case.replace(' ', '_').replace(',', '')}-{path}"  # the run's folder


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
