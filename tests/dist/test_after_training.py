"""After a run: manifest reproduces it, merge folds the adapter in (LoRA and QLoRA), chat on QLoRA, loss.png, env."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _merge(adapter, out, *extra):
    return subprocess.run(
        [sys.executable, "-m", "fsdp_tune", "merge", "--adapter", str(adapter), "-o", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_manifest_reproduces_run_and_merge_and_plot(train, reference_run, tmp_path) -> None:
    first = reference_run  # read only: the replay and the merge write elsewhere
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
    assert steps == [1, 2, 3, 4, 5, 6]  # the points the plot draws

    merged = tmp_path / "merged"
    r = _merge(first.output_dir, merged, "--dtype", "fp32")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "logits match base+adapter" in r.stdout
    assert (merged / "model.safetensors").exists() and (merged / "tokenizer.json").exists()
    r = _merge(first.output_dir, merged, "--dtype", "fp32")
    assert r.returncode == 2 and "--force" in r.stderr  # never overwrites silently


def test_qlora_adapter_merges_as_trained_or_into_the_base_and_chats(train, tmp_path) -> None:
    """A QLoRA run merges, by default, into the 4-bit weights it trained against, dequantized: the merged model
    computes what training computed (checked against the 4-bit base + adapter); --into base merges into the
    16-bit weights instead, which differ from those by the 4-bit rounding. chat loads the base in 4-bit again."""
    import torch
    from transformers import AutoModelForCausalLM

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
    r = _merge(run.output_dir, tmp_path / "as-trained")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "merged into the base's 4-bit weights as the run quantized them, dequantized to float32" in r.stdout
    assert "logits match 4-bit base+adapter" in r.stdout, r.stdout
    r = _merge(run.output_dir, tmp_path / "into-base", "--into", "base")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "merged into the 16-bit base loaded unquantized in float32" in r.stdout, r.stdout
    for folder in ("as-trained", "into-base"):
        config = json.loads((tmp_path / folder / "config.json").read_text())
        assert "quantization_config" not in config and config["dtype"] == "float32", folder
    ids = torch.tensor([list(range(5, 45))])
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(tmp_path / "as-trained")(ids).logits
        b = AutoModelForCausalLM.from_pretrained(tmp_path / "into-base")(ids).logits
    assert ((a - b).abs().max() / b.abs().max()).item() > 1e-3  # NF4's rounding: two different models

    lora = _merge(run.output_dir, tmp_path / "x", "--into", "nonsense")
    assert lora.returncode == 2 and "base or dequantized" in lora.stderr

    chat = subprocess.run(
        [sys.executable, "-m", "fsdp_tune", "chat", str(run.output_dir), "--prompt", "Hi", "--max_new_tokens", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert chat.returncode == 0 and "(4-bit nf4, as trained) + adapter" in chat.stderr, chat.stderr[-3000:]


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
