"""Rows with images, prepared once by rank 0: the conversation rendered and masked as any chat (masking.py: each
image a single placeholder token, where the chat template puts it), then measured as the model will see it.

The processor expands every placeholder into the image's tokens (Qwen2-VL: one per 2x2 patch of the resized image;
LLaVA: one per patch of the crop) when the collator builds the batch (vision_collate.py). Here each image's token
count is taken from its size (the processor's own count, `_get_num_multimodal_tokens`, else the image processed),
so the cut at max_seq_len is made where the model will see it: the text after the last image is cut as TRL cuts
(keep_start); a row whose images max_seq_len would cut into is skipped ("image-cut"), never trained on an image
without all of its tokens (TRL's "Image features and image tokens do not match" mid-training). A row whose image
does not open is skipped ("bad-image"). Each kept sequence carries its images ({bytes, path}, as `datasets`'
Image feature stores them) and their token counts, which the collator checks.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdp_tune.sources.masking import Encoded
from fsdp_tune.sources.vision import resolve

# the images of a prepared sequence, as datasets.Image(decode=False) stores one
IMAGE_FEATURE = {"bytes": "binary", "path": "string"}
SKIPS = {
    "image-cut": "max_seq_len cuts into its image tokens (raise --max_seq_len, or use smaller images)",
    "bad-image": "an image that does not open",
    "template-images": "the chat template renders none of its image blocks as the processor's image token",
    "no-vision": "it has images and the model reads none (a language model: train a vision-language one)",
}


def stored(ref: Any, root: Path) -> dict[str, Any]:
    """An image as a prepared row keeps it: a file by its absolute path, anything else as its bytes."""
    ref = resolve(ref, root)
    if isinstance(ref, str):
        return {"bytes": None, "path": ref}
    if isinstance(ref, Mapping) and ref.get("bytes") is not None:
        return {"bytes": bytes(ref["bytes"]), "path": ref.get("path")}
    if isinstance(ref, (bytes, bytearray)):
        return {"bytes": bytes(ref), "path": None}
    if hasattr(ref, "save"):  # a PIL image (a Hub dataset's decoded Image column)
        out = io.BytesIO()
        ref.save(out, format="PNG")
        return {"bytes": out.getvalue(), "path": None}
    raise ValueError(f"not an image: {type(ref).__name__}")


def unreadable_image() -> tuple[type[BaseException], ...]:
    """What PIL raises for an image that does not open, a decompression bomb included (an image of more than twice
    Image.MAX_IMAGE_PIXELS, ~179 M pixels: a 20000 x 20000 PNG of a few KB would decode to 1.2 GB)."""
    from PIL import Image

    return (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def opened(image: Mapping[str, Any]):
    """The PIL image of a stored one, converted to RGB (what the image processors expect)."""
    from PIL import Image

    source = io.BytesIO(image["bytes"]) if image.get("bytes") is not None else image["path"]
    with Image.open(source) as im:
        return im.convert("RGB")


@dataclass
class ImageTokens:
    """How many tokens the processor gives each image, and which token stands for one before it does."""

    processor: Any

    @property
    def token_id(self) -> int:
        return int(self.processor.image_token_id)

    def count(self, image: Mapping[str, Any]) -> int:
        from PIL import Image

        source = io.BytesIO(image["bytes"]) if image.get("bytes") is not None else image["path"]
        with Image.open(source) as im:
            width, height = im.size
        counter = getattr(self.processor, "_get_num_multimodal_tokens", None)
        if counter is not None:
            try:
                return int(counter(image_sizes=[(height, width)]).num_image_tokens[0])
            except (NotImplementedError, AttributeError, TypeError, KeyError):
                pass
        return len(expansion(self.processor, [opened(image)])[0][0])


def expansion(processor, images: list) -> tuple[list[list[int]], Any]:
    """(each image's token ids, the image processor's output for all of them): the processor's own replacement
    of its image token (ProcessorMixin.replace_image_token), tokenized."""
    processed = processor.image_processor(images=images, return_tensors="pt")
    tok = processor.tokenizer
    ids = []
    for i in range(len(images)):
        text = processor.replace_image_token(processed, image_idx=i)
        ids.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    return ids, processed


def fit(seq: Encoded, images: list[dict], counts: list[int], token_id: int, max_len: int | None) -> str:
    """Cut `seq` (in place) so that, with each image token expanded, it holds at most max_len tokens; returns why
    the sequence cannot be kept ("" when it is). The sequence's images are the first ones its placeholders name."""
    placed = [t for t, i in enumerate(seq.input_ids) if i == token_id]
    if len(placed) > len(images):
        return "image-count"
    extra = sum(c - 1 for c in counts[: len(placed)])
    if max_len is None or len(seq.input_ids) + extra <= max_len:
        return ""
    keep = max_len - extra
    if placed and placed[-1] >= keep:
        return "image-cut"
    seq.input_ids, seq.mask, seq.truncated = seq.input_ids[:keep], seq.mask[:keep], True
    return ""


def sequences(encoder, row: dict[str, Any], train_all: bool, root: Path) -> tuple[str, list[Encoded]]:
    """(why the row is skipped, or ""; its sequences, each with the images its placeholders name and their counts)."""
    try:
        images = [stored(ref, root) for ref in row["images"]]
        counts = [encoder.images.count(image) for image in images]
    except unreadable_image():
        return "bad-image", []
    token = encoder.images.token_id
    found = encoder.sequences({k: v for k, v in row.items() if k != "images"}, train_all, cut=False)
    if not any(token in seq.input_ids for seq in found):
        return "template-images", []
    for seq in found:
        why = fit(seq, images, counts, token, encoder.max_len)
        if why:
            return why, []
        n = seq.input_ids.count(token)
        seq.images, seq.image_tokens = images[:n], counts[:n]
    return "", found


def image_counts(train, evaluation) -> dict[str, Any]:
    """The report's image figures: sequences with images, images, image tokens (empty for data without images)."""
    if "images" not in train.column_names:
        return {}
    out: dict[str, Any] = {}
    for name, ds in (("train", train), ("eval", evaluation)):
        if ds is None or "image_tokens" not in ds.column_names:
            continue
        counts = list(ds["image_tokens"])
        out[name] = {
            "image_sequences": sum(1 for c in counts if c),
            "images": sum(len(c) for c in counts),
            "image_tokens": sum(sum(c) for c in counts),
        }
    if not out.get("train", {}).get("images") and not out.get("eval", {}).get("images"):
        return {}
    return {"images": out}
