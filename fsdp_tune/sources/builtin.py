"""Models fsdp-tune builds locally (`--model_name_or_path builtin:NAME`): shapes here, building in
models/tiny.py, cached once per machine so every run and every rank loads the same weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PRESETS = {
    # ~1.3M parameters: trains 40 steps on 2 CPU ranks in well under a minute
    "tiny-llama": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    ),
    # ~1.2B parameters (Llama-3.2-1B's shape with a 32k vocabulary): the GPU check's model
    "llama-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
    ),
    # ~7.5B parameters (Llama-3-8B's shape with a 32k vocabulary): the GPU check's 8B-class model
    "llama-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
    ),
    # Llama-3-8B's shape, its 128,256-token vocabulary and 8,192 positions included (8.03B parameters): the GPU check's
    # throughput run, at the shape of NeMo AutoModel's published LoRA figure (BENCHMARKS.md section 5)
    "llama3-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
    ),
    # ~443M parameters, 1.7 GiB in fp32: the sharded-loading benchmark's model (benchmarks/loading.py)
    "llama-443m": dict(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=8,
        vocab_size=32000,
    ),
    # ~120M parameters: big enough that sharding shows in RSS
    "small-llama": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
}
VERSION = 2  # bump when a preset or the tokenizer recipe changes: the cache key changes with it


def cache_dir() -> Path:
    return Path(os.environ.get("FSDP_TUNE_CACHE", "~/.cache/fsdp-tune")).expanduser() / "models"


def target(name: str) -> Path:
    """Where builtin model `name` is cached once built."""
    return cache_dir() / f"{name}-v{VERSION}"


def materialize(name: str) -> Path:
    """The folder of builtin model `name`, built on first use (in a subprocess: the launcher stays torch-free)."""
    folder = target(name)
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        built = subprocess.run(
            [sys.executable, "-m", "fsdp_tune.models.tiny", name, str(folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,  # transformers' "Writing model shards" bar: not for the console
            text=True,
        )
        if built.returncode != 0:
            sys.stderr.write(built.stderr)  # the builder's own report, when it failed
            built.check_returncode()
    return folder
