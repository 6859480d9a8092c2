"""After a run: manifest reproduces it, merge folds the adapter in (LoRA and QLoRA), chat on QLoRA, loss.png, env."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app

# merge's result line: "... logits match base+adapter (max relative difference 3.1e-07, tolerance 1e-04)"
MATCHED = re.compile(
    r"logits match (?:4-bit )?base\+adapter \(max relative difference ([0-9.e+-]+), tolerance ([0-9.e+-]+)\)"
)


def _merge(adapter, out, *extra) -> SimpleNamespace:
    """`fsdp-tune merge ...` through the CLI, in this process (as `chat` below): a process of its own would import
    torch, transformers and PEFT again, ~7 CPU-s a merge. The README's quick start runs merge as a process of its
    own (tests/dist/test_console.py)."""
    said = CliRunner().invoke(app, ["merge", "--adapter", str(adapter), "-o", str(out), *extra])
    failure = f"\n{said.exception!r}" if said.exception and not isinstance(said.exception, SystemExit) else ""
    return SimpleNamespace(returncode=said.exit_code, stdout=said.stdout, stderr=said.stderr + failure)


def _within_its_tolerance(said: str) -> float:
    """The difference merge measured, at most the tolerance it states (and that tolerance a real one)."""
    found = MATCHED.search(said)
    assert found, said
    diff, tolerance = float(found.group(1)), float(found.group(2))
    assert diff <= tolerance <= 1e-2, said
    return tolerance


def _logits(folder_or_model, ids):
    import torch
    from transformers import AutoModelForCausalLM

    model = folder_or_model
    if not hasattr(model, "forward"):
        model = AutoModelForCausalLM.from_pretrained(folder_or_model)
    with torch.no_grad():
        return model.eval()(ids).logits


def test_manifest_reproduces_run_and_merge_and_plot(reference_run, continued, tmp_path) -> None:
    first = reference_run  # read only: the replay and the merge write elsewhere
    manifest = json.loads((first.output_dir / "fsdp_tune_run.json").read_text())
    assert manifest["exit_status"] == 0 and manifest["versions"]["torch"] and manifest["world"]["world_size"] == 2
    assert "--max_steps" in manifest["command"]
    # the model as the user named it, not this machine's cache folder: the manifest reproduces the run anywhere
    assert manifest["resolved_config"]["model"]["model_name_or_path"] == "builtin:tiny-llama"
    again = continued["replay"]  # the manifest as the config (tests/dist/conftest.py `continued`)
    assert again.planned.checked.format == "manifest" and again.output_dir != first.output_dir
    assert again.summary["losses"] == pytest.approx(first.summary["losses"], rel=1e-5)

    png = first.output_dir / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from fsdp_tune.tools.report import load_metrics, series

    steps, _ = series(load_metrics(first.output_dir), "loss")
    assert steps == [1, 2, 3, 4, 5, 6]  # the points the plot draws

    merged = tmp_path / "merged"
    r = _merge(first.output_dir, merged, "--dtype", "fp32")
    assert r.returncode == 0, r.stderr[-3000:]
    tolerance = _within_its_tolerance(r.stdout)
    assert (merged / "model.safetensors").exists() and (merged / "tokenizer.json").exists()
    # merge's own check, repeated here: the merged model's logits are base+adapter's, within its tolerance
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir = json.loads((first.output_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    ids = torch.tensor([list(range(5, 45))])
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(first.output_dir))
    want = _logits(adapted, ids)
    got = _logits(merged, ids)
    assert ((got - want).abs().max() / want.abs().max()).item() <= tolerance
    r = _merge(first.output_dir, merged, "--dtype", "fp32")
    assert r.returncode == 2 and "--force" in r.stderr  # never overwrites silently

    # chat takes the merged folder as a whole model (its own dtype and chat template) and answers as the run does
    from fsdp_tune.tools.chat import answer, load

    said = CliRunner().invoke(app, ["chat", str(merged), "--prompt", "Hi", "--max_new_tokens", "4"])
    assert said.exit_code == 0, said.output
    assert f"chat: {merged} (a whole model, its own dtype float32), its chat template, on cpu" in said.output
    turn = [{"role": "user", "content": "Count from 1 to 8."}]
    whole, adapter = load(str(merged), device="cpu"), load(str(first.output_dir), device="cpu")
    assert "adapter" not in whole.described and whole.tokenizer.chat_template == adapter.tokenizer.chat_template
    assert answer(whole, turn, 6, 0.0, stream=False) == answer(adapter, turn, 6, 0.0, stream=False)


def test_qlora_adapter_merges_as_trained_or_into_the_base_and_chats(variants, tmp_path) -> None:
    """A QLoRA run merges, by default, into the 4-bit weights it trained against, dequantized: the merged model
    computes what training computed (checked against the 4-bit base + adapter); --into base merges into the
    16-bit weights instead, which differ from those by the 4-bit rounding. chat loads the base in 4-bit again.
    (The run: nested 4-bit quantization, the variants' group.)"""
    run = variants["qlora"]
    assert run.summary["adapter_check"]["ok"]
    r = _merge(run.output_dir, tmp_path / "as-trained")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "merged into the base's 4-bit weights as the run quantized them, dequantized to float32" in r.stdout
    assert "logits match 4-bit base+adapter" in r.stdout, r.stdout
    _within_its_tolerance(r.stdout)
    r = _merge(run.output_dir, tmp_path / "into-base", "--into", "base")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "merged into the 16-bit base loaded unquantized in float32" in r.stdout, r.stdout
    _within_its_tolerance(r.stdout)
    for folder in ("as-trained", "into-base"):
        config = json.loads((tmp_path / folder / "config.json").read_text())
        assert "quantization_config" not in config and config["dtype"] == "float32", folder
    import torch

    ids = torch.tensor([list(range(5, 45))])
    a, b = _logits(tmp_path / "as-trained", ids), _logits(tmp_path / "into-base", ids)
    assert ((a - b).abs().max() / b.abs().max()).item() > 1e-3  # NF4's rounding: two different models

    lora = _merge(run.output_dir, tmp_path / "x", "--into", "nonsense")
    assert lora.returncode == 2 and "base or dequantized" in lora.stderr

    chat = CliRunner().invoke(app, ["chat", str(run.output_dir), "--prompt", "Hi", "--max_new_tokens", "4"])
    assert chat.exit_code == 0 and "(4-bit nf4, as trained) + adapter" in chat.stderr, chat.output[-3000:]


def test_added_tokens_travel_with_the_adapter(variants, tmp_path) -> None:
    """The zephyr template adds <s> and </s>, which the demo tokenizer lacks (512 -> 514, padded to 520 rows).

    Their embedding rows exist only in this run: the adapter must carry both embedding layers, load onto a
    base resized the same way, and merge."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = variants["zephyr"]
    assert run.summary["vocab_grew"] == {"from": 512, "tokenizer": 514, "rows": 520}
    assert "vocabulary: 512 -> 514 tokens" in run.console
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
    tolerance = _within_its_tolerance(r.stdout)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert torch.equal(merged.get_input_embeddings().weight, embed)
    ids = torch.tensor([list(range(5, 45)) + [513, 512]])  # the new tokens too
    want, got = _logits(model, ids), _logits(merged, ids)
    assert ((got - want).abs().max() / want.abs().max()).item() <= tolerance
