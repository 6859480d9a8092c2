"""The checkpoint side of sharded loading: where each tensor lives, reading row ranges of it, and what only a
rank can find out about a model (its files, transformers' own key conversions) that sends it back to the
transformers path.

Each read opens the file, slices one tensor and closes it again: the mapping, and the resident pages that count
in the rank's RSS, live only as long as the read. Reads are memory-mapped, so the ranks of one node share the
kernel's page cache.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from huggingface_hub import snapshot_download
from safetensors import safe_open

from fsdp_tune.decide.loading import INDEX_FILE, SINGLE_FILE, remote_code_reason
from fsdp_tune.worker.wrappers import canonical_name


class FallbackRequired(RuntimeError):
    """This model cannot be built by sharded loading; raised before any collective, on every rank alike."""


class Checkpoint:
    """The safetensors files of one model folder: key -> file, shapes from the headers, row ranges of a tensor."""

    def __init__(self, folder: str | os.PathLike):
        self.dir = Path(folder)
        if (self.dir / INDEX_FILE).exists():
            weight_map = json.loads((self.dir / INDEX_FILE).read_text())["weight_map"]
        elif (self.dir / SINGLE_FILE).exists():
            with safe_open(str(self.dir / SINGLE_FILE), framework="pt") as f:
                weight_map = dict.fromkeys(f.keys(), SINGLE_FILE)
        else:
            raise FallbackRequired(f"{self.dir} has no safetensors weights ({SINGLE_FILE} or {INDEX_FILE})")
        self.weight_map: dict[str, str] = weight_map
        self.names: dict[str, str] = {}  # the model's key -> the file's, where transformers renames on load
        self._shapes: dict[str, tuple[int, ...]] = {}
        for name in sorted(set(weight_map.values())):
            with safe_open(str(self.dir / name), framework="pt") as f:
                for key in f.keys():
                    self._shapes[key] = tuple(f.get_slice(key).get_shape())

    def __contains__(self, key: str) -> bool:
        return self.names.get(key, key) in self.weight_map

    def shape(self, key: str) -> tuple[int, ...]:
        return self._shapes[self.names.get(key, key)]

    def rows(self, key: str, start: int, stop: int):
        """Rows [start, stop) of tensor `key` (the model's name for it; the whole tensor when it has no dimensions)."""
        key = self.names.get(key, key)
        with safe_open(str(self.dir / self.weight_map[key]), framework="pt") as f:
            piece = f.get_slice(key)
            if not piece.get_shape():
                return f.get_tensor(key)
            return piece[start:stop]


def checkpoint_key(name: str, prefix: str) -> str:
    """A parameter's name in the (PEFT) model -> its key in the base model's checkpoint (wrapper parts dropped
    as the adapter's save drops them: the two must agree)."""
    name = canonical_name(name).removeprefix(prefix)
    name = name.replace(".base_layer.", ".").replace(".original_module.", ".")
    return re.sub(r"\.modules_to_save\.[^.]+\.", ".", name)


def model_folder(name_or_path: str) -> Path:
    """The local folder of the model's files: the folder itself, or the hub snapshot (its safetensors and json
    files, fetched or found in the cache exactly as from_pretrained would)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    try:
        return Path(snapshot_download(name_or_path, allow_patterns=["*.safetensors", "*.json"]))
    except Exception as err:  # noqa: BLE001 - from_pretrained then meets the same problem and says it its way
        raise FallbackRequired(f"the files of {name_or_path} are not at hand ({type(err).__name__}: {err})") from None


def rank_fallback_reason(config, trust_remote_code: bool) -> str | None:
    """What the launcher may not have seen (a hub model's config is read here for the first time): remote code.
    None: sharded loading applies as far as the config tells (the model's key conversions: renamed_keys)."""
    return remote_code_reason(trust_remote_code, getattr(config, "auto_map", None))


def renamed_keys(model, ckpt: Checkpoint) -> dict[str, str]:
    """The model's key -> the checkpoint's, where transformers renames checkpoint keys on load (its conversion
    mapping for the model's classes and types: a vision-language checkpoint's `model.layers.*` is the model's
    `model.language_model.layers.*`), by transformers' own rules. A mapping that converts tensors (fused experts,
    split projections) sends the rank to from_pretrained: FallbackRequired, before any collective."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, rename_source_key
    except ImportError:  # another transformers: the key and shape check before loading still catches a rename
        return {}
    transforms = get_model_conversion_mapping(model)
    converting = [type(t).__name__ for t in transforms if not isinstance(t, WeightRenaming)]
    if converting:
        raise FallbackRequired(f"transformers converts this model's checkpoint tensors on load ({converting[0]})")
    if not transforms:
        return {}
    meta = model.state_dict()
    names = {}
    for key in ckpt.weight_map:
        renamed, _ = rename_source_key(key, transforms, [], getattr(model, "base_model_prefix", None), meta)
        names[renamed] = key
    return {k: v for k, v in names.items() if k != v}
