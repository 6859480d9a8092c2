"""The tiny vision-language models the tests train (fsdp_tune/models/tiny_vlm.py), built once per test session."""

from __future__ import annotations

from pathlib import Path

VERSION = 1  # bump when fsdp_tune/models/tiny_vlm.py changes a shape, the tokenizer or a processor


def build_vlms(cache: Path) -> dict[str, Path]:
    """family -> model folder (weights, tokenizer, processor), building the missing ones."""
    from fsdp_tune.models.tiny_vlm import FAMILIES, build

    root = cache / f"vlm-v{VERSION}"
    root.mkdir(parents=True, exist_ok=True)
    paths = {family: root / family for family in FAMILIES}
    for family, path in paths.items():
        if not path.is_dir():
            build(family, str(path))
    return paths
