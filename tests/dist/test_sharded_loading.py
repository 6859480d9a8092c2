"""Sharded loading trains exactly as from_pretrained does: the same losses and the same saved adapter, bit for bit,
for LoRA, nested-4-bit QLoRA, a vocabulary grown for new chat tokens under FSDP activation checkpointing and bf16,
and the 125M built-in model; and a model only the ranks can tell sharded loading cannot take (its checkpoint lacks
a tensor the model has) falls back on every rank and trains as the transformers path does. Every pair runs in one
torchrun launch (tests/dist/recipes_in_one_group.py): the rank specs come from the launcher's own plan_run, one
per path (--loading transformers | auto, which the launcher resolves to sharded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import FIXTURES, REPO
from tests.dist.conftest import TIMEOUT

QLORA = ("--use_4bit_quantization", "True", "--bnb_4bit_quant_storage_dtype", "float32")
CASES = {
    "lora": (),
    "qlora": (*QLORA, "--bnb_4bit_compute_dtype", "float32", "--use_nested_quant", "True"),
    "grown vocabulary, FSDP AC, bf16": ("--chat_template_format", "zephyr", "--fsdp_activation_checkpointing", "true")
    + ("--bf16", "True"),
    "small-llama": ("--model_name_or_path", "builtin:small-llama", "--max_seq_len", "64")
    + ("--per_device_train_batch_size", "2", "--max_steps", "2"),
}
PATHS = ("transformers", "sharded")
FALLBACK = "fallback on the ranks"


def _resolved(tmp_path: Path, case: str, path: str, flags: tuple[str, ...]) -> str:
    from fsdp_tune.launch import torchrun
    from fsdp_tune.launch.train import plan_run

    out = tmp_path / f"{case.replace(' ', '_').replace(',', '')}-{path}"
    loading = "auto" if path == "sharded" else path  # the default decides sharded loading
    flags = ("--max_steps", "3", *flags, "--loading", loading, "--output_dir", str(out))
    planned = plan_run(str(FIXTURES / "tiny_lora.yaml"), list(flags), lambda m: None)
    assert planned.spec.loading.path == path
    return torchrun.prepare(planned.config, planned.spec, planned.run_id).resolved_path


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


def test_sharded_loading_trains_as_from_pretrained_does(tmp_path, model_cache, monkeypatch) -> None:
    from fsdp_tune.sources.builtin import materialize

    env = {"FSDP_TUNE_CACHE": str(model_cache), "HF_DATASETS_CACHE": str(model_cache / "datasets")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # plan_run materialises the builtin models where the ranks read them
    cases = {**CASES, FALLBACK: ("--model_name_or_path", _without_lm_head(materialize("tiny-llama"), tmp_path / "m"))}
    specs = {(c, p): _resolved(tmp_path, c, p, flags) for c, flags in cases.items() for p in PATHS}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "tests.dist.recipes_in_one_group", *specs.values()]  # from the checkout, as the CLI runs its ranks
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * TIMEOUT, env={**os.environ, **env}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-6000:]
    for case in cases:
        _assert_same_training(case, {p: Path(specs[case, p]).parent for p in PATHS})
    fallback = _summary(Path(specs[FALLBACK, "sharded"]).parent)["extra"]["loading"]
    assert fallback["path"] == "transformers" and "lm_head.weight" in fallback["note"], fallback
    grown = _summary(Path(specs["grown vocabulary, FSDP AC, bf16", "sharded"]).parent)
    assert grown["vocab_grew"]["rows"] > grown["vocab_grew"]["from"]
    qlora = _summary(Path(specs["qlora", "sharded"]).parent)
    assert qlora["extra"]["loading"]["tensors_quantized"] == 28  # 7 linears x 4 layers, each rank its part


def _summary(run: Path) -> dict:
    return json.loads((run / "fsdp_tune_summary.json").read_text())


def _assert_same_training(case: str, runs: dict[str, Path]) -> None:
    from safetensors.torch import load_file

    summary = {p: _summary(runs[p]) for p in PATHS}
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
