"""A vision-language model in the plan (no torch): its vision tower and projector counted (planner/shape.py
measures them on the meta device), and an image's patches (what the tower runs on) and tokens (what the language
model reads) from the model's image processor settings, for a stated image size: the largest image train's
pre-flight found in the data, else ASSUMED (an assumption, said so in the plan). One image per sequence.

The image tokens are part of each sequence: the language model's activations are planned at max_seq_len as for
text, and rank 0 cuts rows so that the expanded sequence fits it. The tower's own activations come on top: a
frozen tower runs without autograd state (no parameter of it trains, pixel values need no grad), so only one
block's forward is live at a time, before the decoder layers; a tower that trains (--freeze_vision_tower false)
keeps every block's activations for its backward, through the whole step (counted, by reading Qwen2-VL's and CLIP's
blocks: not traced).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from fsdp_tune.config.model_kinds import FAMILIES, VisionFamily, family_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.method import steps
from fsdp_tune.planner.shape import ModelShape

ASSUMED = (448, 448)  # width, height: a common training size (Qwen2-VL's 448px, LLaVA-1.5's 336 crop is smaller)
SAVED_PER_PATCH = 7  # values a ViT block keeps a patch for backward besides its MLP's: 2 norms, q, k, v, attention out


@dataclass(frozen=True)
class ImageLoad:
    family: VisionFamily
    width: int
    height: int
    assumed: bool  # ASSUMED, not an image of the data
    patches: int  # what the tower runs on, one image
    tokens: int  # what the language model reads for it


def preprocessor(name: str) -> dict:
    """The model's image processor settings (preprocessor_config.json, else processor_config.json's), {} when
    the folder has neither."""
    folder = Path(name).expanduser()
    for file, key in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
        try:
            data = json.loads((folder / file).read_text())
        except (OSError, ValueError):
            continue
        return data.get(key, {}) if key else data
    return {}


def image_load(shape: ModelShape, size: tuple[int, int] | None = None) -> ImageLoad | None:
    """An image's patches and tokens for the model the shape was measured from (its decided facts), at `size`."""
    config = shape.facts.config
    row = family_of(config)
    if row is None or config is None:
        return None
    width, height = size if size and all(size) else ASSUMED
    folder = shape.facts.path if shape.facts.where in ("local", "cache") else None
    settings, vision = preprocessor(folder) if folder else {}, config.get("vision_config") or {}
    patches, tokens = COUNTS[row.image_tokens](width, height, settings, vision, config)
    return ImageLoad(row, width, height, not (size and all(size)), patches, tokens)


def merged_patches(width: int, height: int, settings: dict, vision: dict, config: dict) -> tuple[int, int]:
    """Qwen2-VL's image processor: resized to a multiple of patch x merge within [min_pixels, max_pixels]
    (image_processing_qwen2_vl.smart_resize), one token per merge x merge patches."""
    patch = int(settings.get("patch_size") or vision.get("patch_size") or 14)
    merge = int(settings.get("merge_size") or vision.get("spatial_merge_size") or 2)
    size = settings.get("size") or {}
    low = int(settings.get("min_pixels") or size.get("shortest_edge") or 56 * 56)
    high = int(settings.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280)
    h, w = smart_resize(height, width, patch * merge, low, high)
    patches = (h // patch) * (w // patch)
    return patches, patches // (merge * merge)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = (
            max(factor, math.floor(height / beta / factor) * factor),
            max(factor, math.floor(width / beta / factor) * factor),
        )
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def fixed_grid(width: int, height: int, settings: dict, vision: dict, config: dict) -> tuple[int, int]:
    """LLaVA's: every image resized and cropped to the crop size, one token per patch (the class token dropped by
    the default feature selection)."""
    crop = settings.get("crop_size") or {}
    side = int(vision.get("image_size") or 336)
    patch = int(vision.get("patch_size") or 14)
    grid = (int(crop.get("height") or side) // patch) * (int(crop.get("width") or side) // patch)
    keep_class = config.get("vision_feature_select_strategy") == "full"
    return grid + 1, grid + int(keep_class)


COUNTS = {"merged_patches": merged_patches, "fixed_grid": fixed_grid}


def tower_activations(cfg: RunConfig, shape: ModelShape, load: ImageLoad, compute_bytes: int) -> float:
    """Bytes the tower keeps for its backward through the step when it trains (0 for a frozen tower), for one
    micro-batch's images (one a row)."""
    if cfg.model.freeze_vision_tower or not shape.vision_layers:
        return 0.0
    rows = steps(cfg).per_device_train_batch_size
    per_patch = (SAVED_PER_PATCH * shape.vision_hidden + 2 * shape.vision_mlp) * compute_bytes
    return rows * load.patches * shape.vision_layers * per_patch


def add_tower(phases: dict, names, cfg: RunConfig, shape: ModelShape, compute_bytes: int, size=None) -> None:
    """A vision tower that trains keeps its blocks' activations from the step's start to its backward: in each of
    the phases `names`."""
    load = image_load(shape, size)
    tower = tower_activations(cfg, shape, load, compute_bytes) if load else 0.0
    if tower:
        for phase in names:
            phases[phase]["vision tower activations (it trains)"] = tower


def describe(shape: ModelShape, load: ImageLoad, cfg: RunConfig) -> dict:
    """The plan's vision entry."""
    m = cfg.model
    return {
        "family": load.family.title,
        "tower_and_projector_params": shape.vision_params,
        "tower_blocks": shape.vision_layers,
        "tower": "trains (LoRA)" if not m.freeze_vision_tower else "frozen",
        "projector": "trains whole" if not m.freeze_multi_modal_projector else "frozen",
        "image": {"width": load.width, "height": load.height, "assumed": load.assumed},
        "patches_per_image": load.patches,
        "tokens_per_image": load.tokens,
    }


__all__ = ["ASSUMED", "FAMILIES", "ImageLoad", "describe", "image_load", "tower_activations"]
