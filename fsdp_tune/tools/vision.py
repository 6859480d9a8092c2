"""A vision-language model behind a run's adapter, for the after-run tools: its processor (saved in the run's folder
beside the adapter, else the base's), a prompt with an image, and whether a model reads images at all (its
config.json: config/model_kinds.py)."""

from __future__ import annotations

from pathlib import Path

from fsdp_tune.config.model_kinds import KINDS, kind_of

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def kind_of_base(base: str) -> str:
    """The base model's kind, from its config.json (a local folder, or the Hub cache)."""
    from fsdp_tune.sources.model import fetch_config

    return kind_of(fetch_config(base))


def reads_images(base: str) -> bool:
    return KINDS[kind_of_base(base)].images


def processor_of(run_dir: Path, base: str, trust_remote_code: bool = False):
    """The processor the run saved (worker/recipe.py), else the base model's, through the loader door."""
    from fsdp_tune.worker.loading.door import open_processor

    saved = any((run_dir / f).exists() for f in PROCESSOR_FILES)
    return open_processor(str(run_dir) if saved else base, trust_remote_code)


def image_prompt(processor, text: str, image, device: str):
    """The processor's inputs (token ids, pixels) for one user turn holding `image` and `text`."""
    from fsdp_tune.config.templates import render_prompt

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    rendered = render_prompt(processor.tokenizer, messages, "the processor's chat template")
    return processor(images=[image], text=[rendered], return_tensors="pt", add_special_tokens=False).to(device)


def open_image(path: str):
    """An image file as RGB (UsageError naming it when it does not open)."""
    from PIL import Image, UnidentifiedImageError

    from fsdp_tune.errors import UsageError

    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError) as e:
        raise UsageError(f"--image {path}: cannot be read ({e})", "a PNG, JPEG or other image file PIL opens") from None
