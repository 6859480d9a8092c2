"""Tiny random models of the architectures people fine-tune, built offline from transformers' config classes
(2 layers, hidden 64, MoE with 4 experts and top-2), once per test session and cached like builtin models."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

VERSION = 1  # bump when a shape or the tokenizer changes: the cache key changes with it
VOCAB = 384
COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
GEMMA = dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=64)

# family -> (config class, extra config kwargs); the model class is the config's causal LM
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False)),
    "mistral": ("MistralConfig", dict(tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=False)),
    "qwen3": ("Qwen3Config", dict(tie_word_embeddings=False, head_dim=16)),
    "gemma2": ("Gemma2Config", GEMMA),  # ties its embeddings by default; attention softcapping: no SDPA
    "gemma3": ("Gemma3TextConfig", GEMMA),
    "phi3": ("Phi3Config", dict(tie_word_embeddings=False)),  # fused qkv_proj and gate_up_proj
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16, tie_word_embeddings=False),
    ),
    "qwen2_tied": ("Qwen2Config", dict(tie_word_embeddings=True)),
}


def build_all(root: Path) -> dict[str, Path]:
    """family -> model folder, building the missing ones (one tokenizer for all)."""
    root = root / f"families-v{VERSION}"
    paths = {family: root / f"tiny-{family}" for family in FAMILIES}
    missing = [f for f, p in paths.items() if not p.is_dir()]
    if missing:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        from fsdp_tune.models.tiny import build_tokenizer

        tokenizer = build_tokenizer(VOCAB)
        for family in missing:
            cls_name, extra = FAMILIES[family]
            config = getattr(transformers, cls_name)(
                vocab_size=max(len(tokenizer), VOCAB),
                pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                dtype="float32",
                **COMMON,
                **extra,
            )
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config)
            tmp = paths[family].with_name(f"{paths[family].name}.tmp{os.getpid()}")
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            try:
                tmp.rename(paths[family])
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
    return paths
