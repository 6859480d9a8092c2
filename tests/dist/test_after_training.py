"""After a run: manifest reproduces it, merge folds the adapter in (LoRA and QLoRA), loss.png, env."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.dist


def _merge(adapter, out, *extra):
    return subprocess.run(
        [sys.executable, "-m", "fsdp_tune", "merge", "--adapter", str(adapter), "-o", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_manifest_reproduces_run_and_merge_and_plot(train, tmp_path) -> None:
    first = train("--max_steps", "4", output_dir=tmp_path / "first")
    manifest = json.loads((first.output_dir / "fsdp_tune_run.json").read_text())
    assert manifest["exit_status"] == 0 and manifest["versions"]["torch"] and manifest["world"]["world_size"] == 2
    assert "--max_steps" in manifest["command"]
    # the model as the user named it, not this machine's cache folder: the manifest reproduces the run anywhere
    assert manifest["resolved_config"]["model"]["model_name_or_path"] == "builtin:tiny-llama"
    again = train(config=first.output_dir / "fsdp_tune_run.json", output_dir=tmp_path / "again")
    assert again.summary["losses"] == pytest.approx(first.summary["losses"], rel=1e-5)

    png = first.output_dir / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from fsdp_tune.tools.report import load_metrics, series

    steps, _ = series(load_metrics(first.output_dir), "loss")
    assert steps == [1, 2, 3, 4]  # the points the plot draws

    merged = tmp_path / "merged"
    r = _merge(first.output_dir, merged, "--dtype", "fp32")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "logits match base+adapter" in r.stdout
    assert (merged / "model.safetensors").exists() and (merged / "tokenizer.json").exists()
    r = _merge(first.output_dir, merged, "--dtype", "fp32")
    assert r.returncode == 2 and "--force" in r.stderr  # never overwrites silently


def test_qlora_adapter_merges_into_unquantized_base(train, tmp_path) -> None:
    run = train(
        "--use_4bit_quantization",
        "True",
        "--bnb_4bit_quant_storage_dtype",
        "float32",
        "--bnb_4bit_compute_dtype",
        "float32",
        "--max_steps",
        "2",
    )
    r = _merge(run.output_dir, tmp_path / "merged", "--dtype", "fp32")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "QLoRA adapter: the base was loaded unquantized" in r.stdout
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert "quantization_config" not in config


def test_added_tokens_travel_with_the_adapter(train, tmp_path) -> None:
    """The zephyr template adds <s> and </s>, which the demo tokenizer lacks (512 -> 514, padded to 520 rows).

    Their embedding rows exist only in this run: the adapter must carry both embedding layers, load onto a
    base resized the same way, and merge."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = train("--chat_template_format", "zephyr", "--max_steps", "2")
    assert run.summary["vocab_grew"] == {"from": 512, "tokenizer": 514, "rows": 520}
    assert "vocabulary: 512 -> 514 tokens" in run.proc.stdout
    saved = load_file(str(run.output_dir / "adapter_model.safetensors"))
    embed, head = saved["base_model.model.model.embed_tokens.weight"], saved["base_model.model.lm_head.weight"]
    assert embed.shape == head.shape == (520, 128)

    tokenizer = AutoTokenizer.from_pretrained(run.output_dir)
    base_dir = json.loads((run.output_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    base.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8, mean_resizing=False)
    model = PeftModel.from_pretrained(base, str(run.output_dir))
    assert torch.equal(model.get_base_model().get_input_embeddings().weight, embed)
    assert torch.equal(model.get_base_model().get_output_embeddings().weight, head)

    r = _merge(run.output_dir, tmp_path / "merged", "--dtype", "fp32")
    assert r.returncode == 0, r.stderr[-3000:]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert torch.equal(merged.get_input_embeddings().weight, embed)


def test_env_json() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fsdp_tune", "env", "--json"], capture_output=True, text=True, timeout=120
    )
    info = json.loads(r.stdout)
    assert info["versions"]["torch"] and info["cpu_count"] >= 1 and "cuda_available" in info
