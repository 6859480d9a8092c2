"""LoRA under FSDP2 on 2 CPU ranks: trains, shards by decoder layer, saves an adapter that loads anywhere."""

from __future__ import annotations

import json


def _reload(adapter_dir):
    """Load base + adapter in this process, without FSDP or torch.distributed."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(cfg["base_model_name_or_path"])
    return PeftModel.from_pretrained(base, str(adapter_dir))


def test_lora_fsdp2_two_ranks(reference_run) -> None:
    run = reference_run  # the base config, with checkpoints on the way
    s = run.summary
    assert s["steps"] == 6
    assert s["loss_last"] < s["loss_first"], s["losses"]
    # decoder layers are FSDP units (not one unit for the whole model)
    assert s["fsdp_units"].get("LlamaDecoderLayer") == 4, s["fsdp_units"]
    assert len(s["per_rank"]) == 2
    assert s["truncated_sequences"] == {"cut": 0, "total": 640, "max_seq_len": 96}  # the demo data fits
    assert (run.output_dir / "trainer_state.json").exists() and (run.output_dir / "tokenizer.json").exists()
    console = run.proc.stdout + run.proc.stderr
    assert console.count("loading model ") == 1 and "starting on" not in console  # rank 0's lines for people only
    assert "rank 0/2 starting" in (run.output_dir / "logs" / "rank-0.log").read_text()  # every rank: its log
    assert "rank 1/2 starting" in (run.output_dir / "logs" / "rank-1.log").read_text()

    import torch
    from safetensors.torch import load_file

    model = _reload(run.output_dir)
    saved = load_file(str(run.output_dir / "adapter_model.safetensors"))
    layers_with_trained_b = set()
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            a = module.lora_A["default"].weight
            b = module.lora_B["default"].weight
            assert a.shape == (8, module.in_features) and b.shape == (module.out_features, 8), name
            if b.abs().sum() > 0:
                layers_with_trained_b.add(name.split(".layers.")[1].split(".")[0])
    assert layers_with_trained_b == {"0", "1", "2", "3"}, layers_with_trained_b
    # what PEFT loaded is exactly what was written
    for key, tensor in saved.items():
        loaded = dict(model.named_parameters())[key.replace(".weight", ".default.weight")]
        assert torch.equal(loaded.detach(), tensor), key


def test_metrics_and_summary_files(reference_run) -> None:
    """metrics.jsonl has a line per logged step; the console ends with the summary. (--verbose, which shows what
    the libraries print live too: the HSDP run of tests/dist/test_train_variants.py.)"""
    run = reference_run
    lines = [json.loads(x) for x in (run.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert "done: 6 steps" in run.proc.stdout and f"adapter: {run.output_dir} (56 LoRA tensors" in run.proc.stdout
    assert "{'loss'" not in run.proc.stdout and "{'loss'" in (run.output_dir / "logs" / "rank-0.log").read_text()


def test_the_dry_runs_rank_spec_is_what_the_ranks_read(reference_run, model_cache) -> None:
    """`train --dry_run --json` with the run's own flags prints exactly the spec the ranks executed (the builtin
    model's folder included: decided, not patched at launch; nothing secret in either). Into the finished run's
    own folder the launch would be refused (PF031, a previous run), so the dry run exits 2 and still prints it."""
    import subprocess
    import sys

    from tests.conftest import offline_env
    from tests.dist.conftest import BASE, REFERENCE

    out = reference_run.output_dir
    cmd = [sys.executable, "-m", "fsdp_tune", "train", "--config", str(BASE), "--output_dir", str(out), *REFERENCE]
    dry = subprocess.run([*cmd, "--dry_run", "--json"], capture_output=True, text=True, env=offline_env(model_cache))
    assert dry.returncode == 2, dry.stderr
    refused = [f["rule"] for f in json.loads(dry.stdout)["preflight"] if f["severity"] == "error"]
    assert refused == ["PF031"], dry.stdout
    ranks = json.loads((out / "fsdp_tune_resolved.json").read_text())["spec"]
    assert json.loads(dry.stdout)["spec"] == ranks
    assert not ranks["model"]["name_or_path"].startswith("builtin:")  # the folder the ranks read
