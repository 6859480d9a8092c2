"""Tiny random vision-language models with their processors, built offline from transformers' config classes
(models/tiny.py's tokenizer recipe, the family's image tokens added, a chat template that renders image blocks).

    qwen2_vl   Qwen2-VL: a ViT of Qwen2VLVisionBlock's whose PatchMerger is the projector, Qwen2 decoder layers
    qwen2_5_vl Qwen2.5-VL: the same layout, windowed attention in the tower (one block of full attention)
    qwen3_vl   Qwen3-VL: the same layout, 16-pixel patches, a DeepStack merger feeding the first decoder layer
    llava      LLaVA: a CLIP vision tower, LlavaMultiModalProjector, Llama decoder layers

The image processors are the PIL ones (no torchvision). Run as `python -m fsdp_tune.models.tiny_vlm FAMILY OUT_DIR`;
the tests build each once per session.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SEED = 1234
VOCAB = 512
TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
)

# ChatML, with each family's image placeholder for an image block ({"type": "image"})
_CHAT = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for block in message['content'] %}{% if block['type'] == 'image' %}IMAGE"
    "{% elif block['type'] == 'text' %}{{ block['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
TEMPLATES = {
    "qwen2_vl": _CHAT.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>"),
    "qwen2_5_vl": _CHAT.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>"),
    "qwen3_vl": _CHAT.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>"),
    "llava": _CHAT.replace("IMAGE", "<image>\n"),
}
TOKENS = {"qwen2_vl": QWEN_TOKENS, "qwen2_5_vl": QWEN_TOKENS, "qwen3_vl": QWEN_TOKENS, "llava": ("<image>",)}


def tokenizer(family: str):
    from fsdp_tune.models.tiny import build_tokenizer

    tok = build_tokenizer(VOCAB)
    tok.add_special_tokens({"additional_special_tokens": list(TOKENS[family])})
    tok.chat_template = TEMPLATES[family]
    return tok


def qwen2_vl(tok):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from fsdp_tune.models.processor import image_only

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}  # head_dim 16: 8 = 2+3+3
    config = Qwen2VLConfig(
        text_config=dict(**TEXT, vocab_size=len(tok), rope_parameters=rope, **_special(tok)),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=TEXT["hidden_size"], num_heads=2, mlp_ratio=2),
        **_qwen_token_ids(tok),
        tie_word_embeddings=False,
        dtype="float32",
    )
    # 28x28 up to 112x112 pixels: 1 to 16 image tokens per image (patch 14, merged 2x2)
    images = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=112 * 112)
    processor = image_only(Qwen2VLProcessor)(image_processor=images, tokenizer=tok, chat_template=tok.chat_template)
    return Qwen2VLForConditionalGeneration, config, processor


def qwen2_5_vl(tok):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from fsdp_tune.models.processor import image_only

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=TEXT["hidden_size"])
    config = Qwen2_5_VLConfig(
        text_config=dict(**TEXT, vocab_size=len(tok), rope_parameters=rope, **_special(tok)),
        vision_config={**vision, "window_size": 56, "fullatt_block_indexes": [1]},
        **_qwen_token_ids(tok),
        tie_word_embeddings=False,
        dtype="float32",
    )
    images = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=112 * 112)
    processor = image_only(Qwen2_5_VLProcessor)(image_processor=images, tokenizer=tok, chat_template=tok.chat_template)
    return Qwen2_5_VLForConditionalGeneration, config, processor


def qwen3_vl(tok):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from fsdp_tune.models.processor import image_only

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=TEXT["hidden_size"])
    config = Qwen3VLConfig(
        text_config=dict(**TEXT, head_dim=16, vocab_size=len(tok), rope_parameters=rope, **_special(tok)),
        vision_config={**vision, "num_position_embeddings": 64, "deepstack_visual_indexes": [0]},
        **_qwen_token_ids(tok),
        tie_word_embeddings=False,
        dtype="float32",
    )
    # 32x32 up to 128x128 pixels: 1 to 16 image tokens per image (patch 16, merged 2x2)
    images = Qwen2VLImageProcessorPil(patch_size=16, min_pixels=32 * 32, max_pixels=128 * 128)
    processor = image_only(Qwen3VLProcessor)(image_processor=images, tokenizer=tok, chat_template=tok.chat_template)
    return Qwen3VLForConditionalGeneration, config, processor


def llava(tok):
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    vision = dict(
        model_type="clip_vision_model",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=56,
        patch_size=14,
        projection_dim=32,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=dict(model_type="llama", **TEXT, vocab_size=len(tok), **_special(tok)),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        tie_word_embeddings=False,
        dtype="float32",
    )
    images = CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's class token, which the "default" strategy drops: 16 image tokens
        chat_template=tok.chat_template,
    )
    return LlavaForConditionalGeneration, config, processor


def _qwen_token_ids(tok) -> dict:
    """A Qwen-VL config's ids of its image, video and vision-span tokens, as the tokenizer numbers them."""
    named = zip(("vision_start", "vision_end", "image", "video"), QWEN_TOKENS, strict=True)
    return {f"{name}_token_id": tok.convert_tokens_to_ids(token) for name, token in named}


def _special(tok) -> dict:
    return dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)


FAMILIES = {"qwen2_vl": qwen2_vl, "qwen2_5_vl": qwen2_5_vl, "qwen3_vl": qwen3_vl, "llava": llava}


def build(family: str, out_dir: str) -> Path:
    import torch

    from fsdp_tune.models.processor import save_processor

    model_class, config, processor = FAMILIES[family](tokenizer(family))
    torch.manual_seed(SEED)
    model = model_class(config)
    out = Path(out_dir)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    model.save_pretrained(tmp)
    save_processor(processor, tmp)
    try:
        tmp.rename(out)  # complete or absent
    except OSError:
        if not out.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(build(sys.argv[1], sys.argv[2]))
