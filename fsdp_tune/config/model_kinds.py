"""Kinds of model as the launcher knows them (no torch): one entry each, holding what the house reads of the kind
as data (traits), so that no module elsewhere asks a kind by its name (tests/unit/test_model_kinds.py).

    causal_lm        a language model (AutoModelForCausalLM) and its tokenizer
    vision_language  a vision tower, a projector and a language model (AutoModelForImageTextToText) and its
                     processor (the tokenizer, the image processor, their chat template)

An entry (ModelKind) says: how the ranks, `chat` and `merge` load it (`auto_class`, `processor`); its FSDP units, LoRA
scope and planner facts (`families`: a row per architecture: which modules are the tower, the projector and the
language model, and how `plan` counts an image's tokens; none: the decoder layers transformers names); its data
(`images`: rows may carry images, kept to the collator and placed by the processor's template; what TRL refuses
for such data, `refuses`); and the settings only it reads (`settings`). Adding a vision family with the shape of
one we have is a row of its `families` alone.

A model's kind is read from its config.json (a `vision_config` makes it vision-language; no flag). The ranks' side
is worker/loading/build.py (the class), worker/loading/processor.py (the processor), sources/vision_rows.py (the
rows) and worker/data/vision_collate.py (the batch). Experts (MoE) are not a kind of their own: a language or a
vision-language model may have them; what they are is sources/moe.py's, read the same way (has_experts,
param_targets).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CAUSAL_LM, VISION_LANGUAGE = "causal_lm", "vision_language"


@dataclass(frozen=True)
class VisionFamily:
    """One vision-language architecture, as its transformers 5.24 modeling file builds it (module paths as
    named_modules spells them in the *ForConditionalGeneration class)."""

    model_type: str
    title: str
    tower: str  # the vision tower
    projector: str  # what maps image features into the language model's embedding space
    language: str  # the language model
    # the tower's block class (an FSDP unit each): one name, or one per vision sub-config model_type
    tower_layers: str | Mapping[str, str]
    # the language model's decoder layer class; None: its text sub-config's modeling file says (_no_split_modules)
    language_layers: str | None
    projector_class: str  # an FSDP unit of its own, so a projector trained whole never shares a unit's dtype
    tower_linears: tuple[str, ...]  # the tower's Linear layers: LoRA's targets there with --freeze_vision_tower false
    image_tokens: str  # how `plan` counts an image's tokens (sources/vision.py IMAGE_TOKENS)
    tested: bool  # trained on 2 CPU ranks by tests/dist/test_vision.py; else the row is by reading
    notes: tuple[str, ...] = field(default=())


# "attn.proj", not "proj": PEFT matches a target as a name suffix, and a bare "proj" also takes the patch embedding
# (visual.patch_embed.proj, a Conv3d), which is not one of the tower's linear layers
QWEN_VL_LINEARS = ("qkv", "attn.proj", "fc1", "fc2", "gate_proj", "up_proj", "down_proj")
QWEN3_VL_LINEARS = ("qkv", "attn.proj", "linear_fc1", "linear_fc2")
CLIP_LINEARS = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")

FAMILIES: dict[str, VisionFamily] = {
    "qwen2_vl": VisionFamily(
        "qwen2_vl",
        "Qwen2-VL",
        tower="model.visual",
        projector="model.visual.merger",
        language="model.language_model",
        tower_layers="Qwen2VLVisionBlock",
        language_layers="Qwen2VLDecoderLayer",
        projector_class="PatchMerger",
        tower_linears=QWEN_VL_LINEARS,
        image_tokens="merged_patches",
        tested=True,
    ),
    "qwen2_5_vl": VisionFamily(
        "qwen2_5_vl",
        "Qwen2.5-VL",
        tower="model.visual",
        projector="model.visual.merger",
        language="model.language_model",
        tower_layers="Qwen2_5_VLVisionBlock",
        language_layers="Qwen2_5_VLDecoderLayer",
        projector_class="Qwen2_5_VLPatchMerger",
        tower_linears=QWEN_VL_LINEARS,
        image_tokens="merged_patches",
        tested=True,
    ),
    "qwen3_vl": VisionFamily(
        "qwen3_vl",
        "Qwen3-VL",
        tower="model.visual",
        projector="model.visual.merger",
        language="model.language_model",
        tower_layers="Qwen3VLVisionBlock",
        language_layers="Qwen3VLTextDecoderLayer",
        projector_class="Qwen3VLVisionPatchMerger",
        tower_linears=QWEN3_VL_LINEARS,
        image_tokens="merged_patches",
        tested=True,
        notes=(
            "its DeepStack mergers (model.visual.deepstack_merger_list: Qwen3VLVisionPatchMerger's too, each an "
            "FSDP unit) feed tower features into early decoder layers; they are in the tower's path, so they "
            "freeze and train (LoRA) with the tower, while --freeze_multi_modal_projector false trains "
            "model.visual.merger alone",
        ),
    ),
    "llava": VisionFamily(
        "llava",
        "LLaVA",
        tower="model.vision_tower",
        projector="model.multi_modal_projector",
        language="model.language_model",
        tower_layers={"clip_vision_model": "CLIPEncoderLayer", "siglip_vision_model": "SiglipEncoderLayer"},
        language_layers=None,
        projector_class="LlavaMultiModalProjector",
        tower_linears=CLIP_LINEARS,
        image_tokens="fixed_grid",
        tested=True,
    ),
}


@dataclass(frozen=True)
class Refusal:
    """A trainer setting TRL 1.16 refuses for data with images (trl/trainer/sft_trainer.py SFTTrainer.__init__ and
    DataCollatorForVisionLanguageModeling): fsdp-tune refuses it before launch (PF081), with TRL's reason."""

    key: str  # the trainer argument (SFTConfig field, or fsdp-tune's data.packing)
    refused: Any  # the value refused
    why: str
    hint: str


VISION_DATA_REFUSES: tuple[Refusal, ...] = (
    Refusal(
        "packing",
        True,
        "packing is not supported for vision datasets (TRL): packed rows would share one image list, and each "
        "image's tokens must stay with their own row",
        "--packing false",
    ),
    Refusal(
        "padding_free",
        True,
        "padding-free training is not supported for vision datasets (TRL): the image features are placed by "
        "position in a padded batch",
        "--padding_free false",
    ),
    Refusal(
        "truncation_mode",
        "keep_end",
        "keep_end truncation is not supported for vision datasets (TRL): it may cut the image tokens from the "
        "front of a row while its pixels are still passed to the model",
        "--truncation_mode keep_start (the default)",
    ),
)


@dataclass(frozen=True)
class ModelKind:
    """One kind of model: everything the house reads of it (the module docstring says what each trait drives)."""

    name: str
    auto_class: str  # the transformers Auto class the ranks, `chat` and `merge` load the model with
    processor: bool  # the ranks load the model's processor, train with it and save it beside the adapter
    title: str
    # its rows may carry images: the model reads them (PF082 otherwise), the trainer keeps each row's image column
    # to the collator (remove_unused_columns false, FT129), the processor's own chat template places them (FT127),
    # images are prepared for SFT's data only (FT126), and what TRL refuses for such data is `refuses` (PF081)
    images: bool = False
    families: Mapping[str, VisionFamily] = field(default_factory=dict)  # by model_type; an unknown one: FT125
    refuses: tuple[Refusal, ...] = ()
    settings: tuple[str, ...] = ()  # config keys only this kind reads: dropped with FT128 for another kind


KINDS: dict[str, ModelKind] = {
    CAUSAL_LM: ModelKind(CAUSAL_LM, "AutoModelForCausalLM", False, "language model"),
    VISION_LANGUAGE: ModelKind(
        VISION_LANGUAGE,
        "AutoModelForImageTextToText",
        True,
        "vision-language model",
        images=True,
        families=FAMILIES,
        refuses=VISION_DATA_REFUSES,
        settings=("model.freeze_vision_tower", "model.freeze_multi_modal_projector"),
    ),
}


def kind_of(config: Mapping[str, Any] | None) -> str:
    """The kind of the model a config.json describes: vision-language when it has a vision tower's config; a
    model whose config is not here is taken as a language model."""
    if isinstance(config, Mapping) and isinstance(config.get("vision_config"), Mapping):
        return VISION_LANGUAGE
    return CAUSAL_LM


def kind_row(config: Mapping[str, Any] | None) -> ModelKind:
    """The entry of the kind a config.json describes."""
    return KINDS[kind_of(config)]


def family_of(config: Mapping[str, Any] | None) -> VisionFamily | None:
    """The family row of a config.json (None: a kind without families, or a family without a row)."""
    return kind_row(config).families.get(str(config.get("model_type"))) if config else None
