"""The model's architecture, read from files on this machine (HF cache, reference configs), without torch."""

from __future__ import annotations

import json

from fsdp_tune.sources import model as model_source
from fsdp_tune.validate import check


def _cache_model(cache, repo_id: str, config: dict) -> None:
    snap = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))


def test_a_cached_hub_model_is_checked(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    _cache_model(tmp_path, "Qwen/Qwen2-7B", {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
    checked = check(
        None,
        [
            "--model_name_or_path",
            "Qwen/Qwen2-7B",
            "--fsdp_version",
            "2",
            "--fsdp_transformer_layer_cls_to_wrap",
            "LlamaDecoderLayer",
        ],
    )
    [found] = [f for f in checked.findings if f.rule == "FT080"]
    assert "LlamaDecoderLayer: no such class in Qwen/Qwen2-7B (qwen2)" in found.message
    assert "Qwen2DecoderLayer" in found.hint


def test_special_model_types_map_to_their_module() -> None:
    # gemma3_text lives in models/gemma3 (transformers' SPECIAL_MODEL_TYPE_TO_MODULE_NAME)
    src = model_source._read("gemma3_text")
    assert src is not None and "Gemma3DecoderLayer" in src.classes


def test_unknown_or_remote_code_models_are_not_guessed(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    _cache_model(tmp_path, "acme/custom", {"model_type": "acme_custom_arch", "auto_map": {}})
    assert model_source.for_model("acme/custom") is None
    assert model_source.for_model("acme/not-here") is None
    checked = check(
        None, ["--model_name_or_path", "acme/custom", "--use_peft_lora", "True", "--lora_target_modules", "wqkv"]
    )
    assert not [f for f in checked.findings if f.rule in ("FT080", "FT081")]


def test_a_model_without_no_split_modules_needs_its_layer_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    _cache_model(tmp_path, "microsoft/biogpt", {"model_type": "biogpt"})
    checked = check(None, ["--model_name_or_path", "microsoft/biogpt", "--fsdp_version", "2"])
    [found] = [f for f in checked.findings if f.rule == "FT080"]
    assert found.severity.name == "WARNING" and "BioGptDecoderLayer" in found.hint
    named = check(
        None,
        [
            "--model_name_or_path",
            "microsoft/biogpt",
            "--fsdp_version",
            "2",
            "--fsdp_transformer_layer_cls_to_wrap",
            "BioGptDecoderLayer",
        ],
    )
    assert not [f for f in named.findings if f.rule == "FT080"]
