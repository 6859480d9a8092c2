"""A vision-language model's processor (its tokenizer, its image processor and their chat template), loaded and saved
the same way by the ranks (worker/loading/processor.py), `chat`, `merge` and the tests' tiny models
(models/tiny_vlm.py).

transformers 5.24 builds an image processor without torchvision (the PIL backends, image_processing_pil_*.py, are
chosen when torchvision is absent), but a processor whose class also holds a video processor (Qwen2-VL, Qwen2.5-VL,
Qwen3-VL) cannot be built at all without it: AutoProcessor raises ImportError for the video processor, and the class
refuses `video_processor=None`. fsdp-tune trains images, never videos, so such a processor is then built without its
video processor: the same class (same name, so what it saves names the real class and loads anywhere torchvision is
installed), minus that one attribute. Where torchvision is installed AutoProcessor's own processor is used.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

VIDEO = "video_processor"


def load_processor(name_or_path: str, trust_remote_code: bool = False, revision: str | None = None):
    """AutoProcessor's processor for the model, or the same class without its video processor when that needs
    torchvision (see the module's docstring)."""
    from transformers import AutoProcessor

    kwargs: dict = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    try:
        return AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except (ImportError, AttributeError) as e:
        if not _torchvision_missing(e):
            raise
    return image_only(processor_class(name_or_path)).from_pretrained(name_or_path, **kwargs)


def _torchvision_missing(error: BaseException) -> bool:
    """transformers' two ways of failing on a video processor without torchvision: an ImportError naming it, or
    the placeholder VIDEO_PROCESSOR_MAPPING without `_extra_content` (processing_utils.get_possibly_dynamic_module)."""
    text = str(error)
    return "Torchvision" in text or "torchvision" in text or "VIDEO_PROCESSOR_MAPPING" in text


def processor_class(name_or_path: str) -> type:
    """The processor class a model folder names (processor_config.json, tokenizer_config.json), else its
    model type's in transformers' PROCESSOR_MAPPING_NAMES."""
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES, processor_class_from_name

    folder = Path(name_or_path)
    for file in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        try:
            named = json.loads((folder / file).read_text()).get("processor_class")
        except (OSError, ValueError):
            continue
        if named:
            return processor_class_from_name(named)
    from fsdp_tune.sources.model import model_config

    model_type = (model_config(str(folder)) or {})["model_type"]
    return processor_class_from_name(PROCESSOR_MAPPING_NAMES[model_type])


@functools.cache
def image_only(cls: type) -> type:
    """`cls` without its video processor, under cls's own name (what save_pretrained writes names cls)."""
    if VIDEO not in cls.get_attributes():
        return cls

    def get_attributes(inner) -> list[str]:
        return [a for a in cls.get_attributes() if a != VIDEO]

    return type(cls.__name__, (cls,), {"get_attributes": classmethod(get_attributes), "__module__": cls.__module__})


def save_processor(processor, folder: str | Path) -> None:
    """The processor as transformers saves it (processor_config.json, the tokenizer, the chat template) and the
    image processor's own preprocessor_config.json beside it, which readers before transformers 5 (and vLLM, TGI)
    look for."""
    processor.save_pretrained(str(folder))
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is not None:
        image_processor.save_pretrained(str(folder))
